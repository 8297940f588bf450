// Small progressive enhancements; every page renders without them.
(function () {
  "use strict";
  var MAX_LINES = 2000;

  // ---- live stderr panels: resume after a reconnect, pause, clear, filter ----
  function panelFor(el) { return el && el.closest ? el.closest("[data-stderr-panel]") : null; }

  function state(panel) {
    if (!panel._lf) {
      panel._lf = { lastSeq: 0, seen: new Set(), paused: false, buffer: [], hook: "", text: "" };
      panel.querySelectorAll(".stderr .ln").forEach(function (ln) { remember(panel._lf, ln); });
    }
    return panel._lf;
  }

  function remember(st, ln) {
    var seq = parseInt(ln.getAttribute("data-seq"), 10) || 0;
    st.seen.add(seq);
    if (seq > st.lastSeq) st.lastSeq = seq;
    return seq;
  }

  function matches(st, ln) {
    if (st.hook && ln.getAttribute("data-hook") !== st.hook) return false;
    if (st.text && ln.textContent.toLowerCase().indexOf(st.text) < 0) return false;
    return true;
  }

  function applyFilter(panel) {
    var st = state(panel);
    panel.querySelectorAll(".stderr .ln").forEach(function (ln) { ln.hidden = !matches(st, ln); });
  }

  function setStatus(panel, text) {
    var s = panel.querySelector("[data-stderr-status]");
    if (s) s.textContent = text;
  }

  // Lines arrive as OOB "beforeend" swaps into .stderr; this observer de-duplicates them by seq, holds them
  // back while paused, applies the filters and keeps the newest line in view.
  function watch(panel) {
    var box = panel.querySelector(".stderr");
    if (!box || box._lfWatched) return;
    box._lfWatched = true;
    state(panel);
    new MutationObserver(function (mutations) {
      var st = state(panel);
      var atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      mutations.forEach(function (m) {
        m.addedNodes.forEach(function (node) {
          if (node.nodeType !== 1 || !node.classList.contains("ln") || node._lfKnown) return;
          var seq = parseInt(node.getAttribute("data-seq"), 10) || 0;
          if (st.seen.has(seq)) { node.remove(); return; }  // a repeat: never show a line twice
          node._lfKnown = true;
          remember(st, node);
          node.hidden = !matches(st, node);
          if (st.paused) { node.remove(); st.buffer.push(node); }
        });
      });
      var empty = panel.querySelector("[data-stderr-empty]");
      if (empty && box.querySelector(".ln")) empty.remove();
      var lines = box.querySelectorAll(".ln");
      for (var i = 0; i < lines.length - MAX_LINES; i++) lines[i].remove();
      if (st.paused) setStatus(panel, "paused · " + st.buffer.length + " new line(s) held");
      else if (atBottom) box.scrollTop = box.scrollHeight;
    }).observe(box, { childList: true });
    box.scrollTop = box.scrollHeight;
  }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("[data-stderr-pause], [data-stderr-clear]");
    var panel = panelFor(btn);
    if (!panel) return;
    var st = state(panel);
    var box = panel.querySelector(".stderr");
    if (btn.hasAttribute("data-stderr-pause")) {
      st.paused = !st.paused;
      btn.setAttribute("aria-pressed", st.paused ? "true" : "false");
      btn.textContent = st.paused ? "Resume" : "Pause";
      if (!st.paused) {
        st.buffer.forEach(function (n) { box.appendChild(n); });
        st.buffer = [];
        box.scrollTop = box.scrollHeight;
        setStatus(panel, "live");
      } else {
        setStatus(panel, "paused · 0 new line(s) held");
      }
    } else {
      box.querySelectorAll(".ln").forEach(function (n) { n.remove(); });
      st.buffer = [];
      setStatus(panel, st.paused ? "paused · cleared" : "live · cleared");
    }
  });

  function onFilterInput(ev) {
    var panel = panelFor(ev.target);
    if (!panel || !ev.target.matches("[data-stderr-hook], [data-stderr-text]")) return;
    var st = state(panel);
    st.hook = (panel.querySelector("[data-stderr-hook]") || {}).value || "";
    st.text = ((panel.querySelector("[data-stderr-text]") || {}).value || "").toLowerCase();
    applyFilter(panel);
  }
  document.addEventListener("input", onFilterInput);
  document.addEventListener("change", onFilterInput);

  document.addEventListener("htmx:wsOpen", function (ev) {
    var panel = panelFor(ev.target);
    if (panel) setStatus(panel, state(panel).paused ? "paused" : "live");
    document.body.setAttribute("data-ws-open", String((parseInt(document.body.getAttribute("data-ws-open"), 10) || 0) + 1));
  });
  document.addEventListener("htmx:wsClose", function (ev) {
    var code = ev.detail && ev.detail.event ? ev.detail.event.code : 0;
    // The ws extension retries only after abnormal closes; a server shutting down cleanly says 1001
    // ("going away"): retry that too, a little later, so a restarted server picks every page up again.
    if (code === 1001 && ev.detail.socketWrapper && document.body.contains(ev.target)) {
      setTimeout(function () { ev.detail.socketWrapper.reconnect(); }, 1000 + Math.random() * 2000);
    }
    var panel = panelFor(ev.target);
    if (!panel) return;
    if (code === 4401 || code === 4403) setStatus(panel, "not signed in any more: reload the page to log in again");
    else if ([1001, 1006, 1011, 1012, 1013].indexOf(code) >= 0) setStatus(panel, "disconnected · reconnecting…");
    else setStatus(panel, "disconnected (code " + code + "): reload the page to resume");
  });

  // Every (re)connect of a stderr socket asks only for lines after the last one this page has: the server sends
  // its stored tail after that seq, then live lines, so nothing is lost or repeated across a reconnect.
  function installSocketFactory() {
    if (!window.htmx || window.htmx._lfSockets) return;
    window.htmx._lfSockets = true;
    window.lfSockets = [];
    window.htmx.createWebSocket = function (url) {
      var u = new URL(url, location.href);
      if (u.pathname.indexOf("/ws/stderr/") === 0) {
        var panel = null;
        document.querySelectorAll("[data-stderr-socket]").forEach(function (el) {
          var src = new URL(el.getAttribute("ws-connect"), location.href);
          if (src.pathname === u.pathname) panel = panelFor(el);
        });
        if (panel) u.searchParams.set("after", String(state(panel).lastSeq));
      }
      var sock = new WebSocket(u.toString(), []);
      sock.binaryType = window.htmx.config.wsBinaryType || "blob";
      window.lfSockets.push(sock);
      return sock;
    };
  }

  function init() {
    installSocketFactory();
    document.querySelectorAll("[data-stderr-panel]").forEach(watch);
  }
  // The ws extension connects on htmx's load; our factory must be in place first (scripts are deferred in order).
  installSocketFactory();
  document.addEventListener("DOMContentLoaded", init);
  document.addEventListener("htmx:load", function () { document.querySelectorAll("[data-stderr-panel]").forEach(watch); });
})();
