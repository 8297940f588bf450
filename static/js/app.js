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
    if (ln.getAttribute("data-epoch")) st.epoch = ln.getAttribute("data-epoch");
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
          if (node.nodeType === 1 && node.classList.contains("renumbered")) {
            // the server's line counter started again: old numbers say nothing about the new lines
            st.seen = new Set();
            st.lastSeq = 0;
            st.epoch = node.getAttribute("data-epoch") || "";
            return;
          }
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
      var lines = box.querySelectorAll(".ln, .missed");
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
      box.querySelectorAll(".ln, .missed").forEach(function (n) { n.remove(); });
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

  // Every (re)connect of a stderr socket asks only for lines after the last one this page has (and names the
  // numbering, epoch, that seq belongs to): the server sends its stored tail after that seq, then live lines, so
  // nothing is lost or repeated across a reconnect.
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
        if (panel) {
          u.searchParams.set("after", String(state(panel).lastSeq));
          if (state(panel).epoch) u.searchParams.set("epoch", state(panel).epoch);
        }
      }
      var sock = new WebSocket(u.toString(), []);
      sock.binaryType = window.htmx.config.wsBinaryType || "blob";
      window.lfSockets.push(sock);
      return sock;
    };
  }

  // ---- theme: the toggle overrides prefers-color-scheme and is remembered (static/js/theme.js applies it early) ----
  var darkQuery = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
  function currentTheme() {
    var t = document.documentElement.getAttribute("data-theme");
    if (t === "dark" || t === "light") return t;
    return darkQuery && darkQuery.matches ? "dark" : "light";
  }
  function syncThemeButtons() {
    var dark = currentTheme() === "dark";
    document.documentElement.setAttribute("data-effective-theme", dark ? "dark" : "light");
    document.querySelectorAll("[data-theme-toggle]").forEach(function (b) {
      b.setAttribute("aria-pressed", dark ? "true" : "false");
      b.title = dark ? "Switch to light mode" : "Switch to dark mode";
    });
  }
  function themeChanged() { syncThemeButtons(); redrawCharts(); }
  if (darkQuery && darkQuery.addEventListener) darkQuery.addEventListener("change", themeChanged);

  // ---- confirmations: native <form data-confirm="…"> without htmx (htmx forms use hx-confirm); no inline
  // handlers anywhere, the Content-Security-Policy allows none ----
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var msg = form.getAttribute && form.getAttribute("data-confirm");
    if (msg && !form.hasAttribute("hx-post") && !window.confirm(msg)) ev.preventDefault();
  }, true);

  // ---- small controls: theme toggle, the narrow-screen menu, copy buttons ----
  function closeMenu() {
    var nav = document.getElementById("main-nav");
    var btn = document.querySelector("[data-menu-toggle]");
    if (nav) nav.classList.remove("open");
    if (btn) btn.setAttribute("aria-expanded", "false");
  }
  document.addEventListener("click", function (ev) {
    var t = ev.target.closest("[data-theme-toggle]");
    if (t) {
      var next = currentTheme() === "dark" ? "light" : "dark";
      document.documentElement.setAttribute("data-theme", next);
      try { localStorage.setItem("lf-theme", next); } catch (e) { /* not persisted */ }
      themeChanged();
      return;
    }
    var m = ev.target.closest("[data-menu-toggle]");
    if (m) {
      var nav = document.getElementById(m.getAttribute("aria-controls"));
      var open = !nav.classList.contains("open");
      nav.classList.toggle("open", open);
      m.setAttribute("aria-expanded", open ? "true" : "false");
      if (open) { var first = nav.querySelector("a"); if (first) first.focus(); }
      return;
    }
    if (!ev.target.closest("#main-nav")) closeMenu();
    var c = ev.target.closest("[data-copy]");
    if (c) copyFrom(c);
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key !== "Escape") return;
    var nav = document.getElementById("main-nav");
    if (nav && nav.classList.contains("open")) {
      closeMenu();
      var btn = document.querySelector("[data-menu-toggle]");
      if (btn) btn.focus();
    }
  });

  function copyFrom(btn) {
    var src = document.querySelector(btn.getAttribute("data-copy"));
    if (!src) return;
    var text = src.value !== undefined && src.tagName !== "PRE" ? src.value : src.textContent;
    // Always a word back: "Copied", or, where the browser refused, the text stays selected for Ctrl+C.
    var label = btn._lfLabel || (btn._lfLabel = btn.textContent);
    var say = function (words, cls) {
      btn.textContent = words;
      btn.classList.add(cls);
      clearTimeout(btn._lfTimer);
      btn._lfTimer = setTimeout(function () { btn.textContent = label; btn.classList.remove(cls); }, 2500);
    };
    var done = function () { say("Copied", "copied"); };
    var refused = function () { say("Selected: press Ctrl+C", "copy-refused"); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { legacyCopy(src, done, refused); });
    } else {
      legacyCopy(src, done, refused);
    }
  }
  function legacyCopy(src, done, refused) {
    // Plain-http dashboards have no async clipboard: select the text and use the old command.
    var range = document.createRange();
    range.selectNodeContents(src);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    (ok ? done : refused)();
  }

  // ---- charts: latency percentiles and calls per step, from /metrics/chart.json (uPlot) ----
  var REFRESH_MS = 15000;
  function fmtMs(v) {
    if (v === null || v === undefined) return "—";
    if (v >= 10000) return (v / 1000).toFixed(1) + " s";
    if (v >= 1000) return (v / 1000).toFixed(2) + " s";
    if (v >= 100) return v.toFixed(0) + " ms";
    if (v >= 10) return v.toFixed(1) + " ms";
    return v.toFixed(2) + " ms";
  }
  function fmtCount(v) { return v === null || v === undefined ? "—" : String(Math.round(v)); }
  function cssVar(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  var RANGE_WORDS = { "15m": "last 15 min", "1h": "last hour", "24h": "last 24 h", "7d": "last 7 days" };

  var SPANS = { "15m": 900, "1h": 3600, "24h": 86400, "7d": 604800 };
  function chartState(card) {
    if (!card._lf) {
      // the range is part of the page's URL (?range=, or ?from=&to=): shareable, and kept on reload
      var q = new URLSearchParams(location.search);
      var range = q.get("range") in SPANS ? q.get("range") : card.getAttribute("data-range") || "1h";
      var from = parseInt(q.get("from"), 10), to = parseInt(q.get("to"), 10);
      if (from > 0 && to > from) range = "custom";
      card._lf = { range: range, from: range === "custom" ? from : null, to: range === "custom" ? to : null,
                   plots: [], data: null };
      pressRange(card, range);
    }
    return card._lf;
  }
  function pressRange(card, range) {
    card.querySelectorAll("[data-range-btn]").forEach(function (b) {
      b.setAttribute("aria-pressed", b.getAttribute("data-range-btn") === range ? "true" : "false");
    });
  }
  // The x-axis of a relative range ends now, whatever the data's last fetch said.
  function xWindow(card) {
    var st = chartState(card), d = st.data;
    if (st.range === "custom" || !SPANS[st.range]) return d ? [d.start, d.end] : [st.from, st.to];
    var now = Date.now() / 1000;
    return [now - SPANS[st.range], now];
  }

  function chartUrl(card) {
    var st = chartState(card);
    var u = new URL(card.getAttribute("data-src"), location.href);
    if (st.range === "custom") { u.searchParams.set("from", String(st.from)); u.searchParams.set("to", String(st.to)); }
    else u.searchParams.set("range", st.range);
    return u.toString();
  }

  function loadChart(card) {
    var st = chartState(card);
    var seq = (st.seq || 0) + 1;
    st.seq = seq;
    card.setAttribute("aria-busy", "true");
    fetch(chartUrl(card), { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (res) {
        if (seq !== st.seq) return;  // a newer request (another range) won
        card.removeAttribute("aria-busy");
        if (!res.ok) { summary(card, null, res.body.error || "could not load"); return; }
        st.data = res.body;
        drawChart(card);
      })
      .catch(function () { card.removeAttribute("aria-busy"); summary(card, null, "could not load the chart data"); });
  }

  function summary(card, d, error) {
    var el = card.querySelector("[data-chart-summary]");
    if (!el) return;
    if (error) { el.innerHTML = ""; var e = document.createElement("span"); e.className = "chart-error"; e.textContent = error; el.appendChild(e); return; }
    var s = d.summary;
    var st = chartState(card);
    var when = st.range === "custom"
      ? new Date(d.start * 1000).toLocaleString() + " → " + new Date(d.end * 1000).toLocaleString()
      : RANGE_WORDS[st.range] || st.range;
    var parts = [
      ["", when],
      ["calls", fmtCount(s.calls)],
      ["errors", fmtCount(s.errors) + (s.error_rate !== null ? " (" + (s.error_rate * 100).toFixed(1) + " %)" : "")],
      ["p50", fmtMs(s.p50_ms)], ["p95", fmtMs(s.p95_ms)], ["p99", fmtMs(s.p99_ms)],
      ["test console", fmtCount(s.test_console_calls)],
      ["step", d.step_s >= 3600 ? (d.step_s / 3600) + " h" : (d.step_s / 60) + " min"],
    ];
    el.innerHTML = "";
    parts.forEach(function (p, i) {
      if (i) el.appendChild(document.createTextNode(" · "));
      if (p[0]) el.appendChild(document.createTextNode(p[0] + " "));
      var b = document.createElement("b");
      b.textContent = p[1];
      el.appendChild(b);
    });
  }

  // Axis labels: shorter than the legend's figures ("150 ms", "2.5 s"), whole numbers for counts.
  function axisMs(v) {
    if (v === null) return "";
    if (v === 0) return "0";
    if (v >= 1000) return +(v / 1000).toFixed(2) + " s";
    return +v.toFixed(v >= 10 ? 0 : 2) + " ms";
  }
  var COUNT_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];
  function axes(fmt, incrs) {
    var fg = cssVar("--muted"), grid = cssVar("--grid");
    var y = { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, size: 64,
              values: function (u, vals) { return vals.map(fmt); } };
    if (incrs) y.incrs = incrs;
    return [{ stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } }, y];
  }

  function drawChart(card) {
    var st = chartState(card);
    var d = st.data;
    if (!d || !window.uPlot) return;
    summary(card, d);
    card.setAttribute("data-from", String(d.start));
    card.setAttribute("data-to", String(d.end));
    card.setAttribute("data-points", String(d.t.length));
    card.setAttribute("data-loaded-range", d.range);
    var newest = null;
    for (var i = d.t.length - 1; i >= 0; i--) { if (d.calls[i] || d.test_console_calls[i]) { newest = d.t[i]; break; } }
    card.setAttribute("data-newest-bucket", newest === null ? "" : String(newest));
    var xRange = function () { return xWindow(card); };
    var latency = [d.t, d.p50_ms, d.p95_ms, d.p99_ms];
    var calls = [d.t, d.calls, d.errors, d.test_console_calls];
    var hooks = Object.keys(d.error_rate_by_hook || {});
    var rates = [d.t].concat(hooks.map(function (k) { return d.error_rate_by_hook[k]; }));
    listMarkers(card, d.markers || []);
    if (st.plots.length === 3 && st.theme === currentTheme() && st.hooks === hooks.join()) {
      st.plots[0].setData(latency); st.plots[1].setData(calls); st.plots[2].setData(rates);  // y scales refit
      followClock(card);
      return;
    }
    st.hooks = hooks.join();
    st.plots.forEach(function (p) { p.destroy(); });
    st.theme = currentTheme();
    var latEl = card.querySelector("[data-chart-latency]"), callEl = card.querySelector("[data-chart-calls]");
    var errEl = card.querySelector("[data-chart-errors]");
    var drawMarkers = function (u) { paintMarkers(u, chartState(card).data); };
    var w = function (el) { return Math.max(260, el.clientWidth); };
    var h = window.innerWidth < 600 ? 180 : 220;
    var bars = window.uPlot.paths && window.uPlot.paths.bars ? window.uPlot.paths.bars({ size: [0.8, 40] }) : undefined;
    // A bucket between empty ones is a dot (a line needs two points); short series show every point.
    var points = { show: true, filter: function (u, si) { return d.t.length < 80 ? null : isolated(u.data[si]); } };
    var zoom = { drag: { x: true, y: false, setScale: false } };
    var p1 = new window.uPlot({
      width: w(latEl), height: h, cursor: zoom, hooks: { setSelect: [function (u) { zoomTo(card, u); }], draw: [drawMarkers] },
      scales: { x: { time: true, range: xRange }, y: { range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.1 : 1]; } } },
      series: [
        { value: function (u, v) { return v === null ? "—" : new Date(v * 1000).toLocaleString(); } },
        { label: "p50", stroke: cssVar("--c-p50"), width: 2, value: function (u, v) { return fmtMs(v); }, points: points },
        { label: "p95", stroke: cssVar("--c-p95"), width: 1.5, value: function (u, v) { return fmtMs(v); }, points: points },
        { label: "p99", stroke: cssVar("--c-p99"), width: 1.5, dash: [5, 4], value: function (u, v) { return fmtMs(v); }, points: points },
      ],
      axes: axes(axisMs),
    }, latency, latEl);
    var p2 = new window.uPlot({
      width: w(callEl), height: h, cursor: zoom, hooks: { setSelect: [function (u) { zoomTo(card, u); }], draw: [drawMarkers] }, scales: { x: { time: true, range: xRange }, y: { range: function (u, lo, hi) { return [0, Math.max(1, hi * 1.1)]; } } },
      series: [
        { value: function (u, v) { return v === null ? "—" : new Date(v * 1000).toLocaleString(); } },
        { label: "calls", stroke: cssVar("--c-calls"), fill: cssVar("--c-calls") + "55", paths: bars, points: { show: false }, value: function (u, v) { return fmtCount(v); } },
        { label: "errors", stroke: cssVar("--c-errors"), fill: cssVar("--c-errors") + "99", paths: bars, points: { show: false }, value: function (u, v) { return fmtCount(v); } },
        { label: "test console", stroke: cssVar("--c-console"), width: 1.5, points: { show: false }, value: function (u, v) { return fmtCount(v); } },
      ],
      axes: axes(function (v) { return v === null ? "" : fmtCount(v); }, COUNT_INCRS),
    }, calls, callEl);
    var palette = ["--c-p99", "--c-p95", "--c-p50", "--c-console", "--c-calls"];
    var p3 = new window.uPlot({
      width: w(errEl), height: h, cursor: zoom, hooks: { setSelect: [function (u) { zoomTo(card, u); }], draw: [drawMarkers] },
      scales: { x: { time: true, range: xRange }, y: { range: function () { return [0, 100]; } } },
      series: [{ value: function (u, v) { return v === null ? "—" : new Date(v * 1000).toLocaleString(); } }].concat(
        hooks.map(function (k, i) {
          return { label: k, stroke: cssVar(palette[i % palette.length]), width: 1.5, dash: i >= palette.length ? [4, 3] : undefined,
                   points: points, value: function (u, v) { return v === null ? "—" : v + " %"; } };
        })),
      axes: axes(function (v) { return v === null ? "" : v + " %"; }),
    }, rates, errEl);
    st.plots = [p1, p2, p3];
    followClock(card);
    if (!card._lfResize && window.ResizeObserver) {
      card._lfResize = new ResizeObserver(function () {
        chartState(card).plots.forEach(function (p, i) {
          var el = [latEl, callEl, errEl][i];
          if (Math.abs(p.width - w(el)) > 4) p.setSize({ width: w(el), height: p.height });
        });
      });
      card._lfResize.observe(card);
    }
  }

  // Changes (reloads, config changes, worker starts: plugins_app/selectors/metrics.py markers) as dashed lines.
  function paintMarkers(u, d) {
    if (!d || !d.markers || !d.markers.length) return;
    var ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
    ctx.save();
    ctx.strokeStyle = cssVar("--muted");
    ctx.setLineDash([3, 3]);
    ctx.lineWidth = 1;
    d.markers.forEach(function (m) {
      var x = Math.round(u.valToPos(m.t, "x", true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
    });
    ctx.restore();
  }
  function listMarkers(card, markers) {
    var ul = card.querySelector("[data-chart-markers]");
    if (!ul) return;
    ul.innerHTML = "";
    card.setAttribute("data-markers", String(markers.length));
    if (!markers.length) { var none = document.createElement("li"); none.className = "muted"; none.textContent = "None."; ul.appendChild(none); }
    markers.forEach(function (m) {
      var li = document.createElement("li");
      li.setAttribute("data-marker", m.kind);
      li.textContent = new Date(m.t * 1000).toLocaleString() + " · " + m.label;
      ul.appendChild(li);
    });
  }

  function isolated(values) {
    var out = [];
    for (var i = 0; i < values.length; i++) {
      if (values[i] !== null && values[i] !== undefined && (i === 0 || values[i - 1] === null)
          && (i === values.length - 1 || values[i + 1] === null)) out.push(i);
    }
    return out;
  }

  // Move the x-axis to the clock (relative ranges), and say where it ends (data-axis-to) for people and tests.
  function followClock(card) {
    var st = chartState(card), win = xWindow(card);
    st.plots.forEach(function (p) { p.setScale("x", { min: win[0], max: win[1] }); });
    card.setAttribute("data-axis-from", String(Math.round(win[0])));
    card.setAttribute("data-axis-to", String(Math.round(win[1])));
  }

  // Drag across a chart to zoom: the selection becomes a custom range (in the URL too); a range button goes back.
  function zoomTo(card, u) {
    if (u.select.width < 5) return;
    var from = Math.floor(u.posToVal(u.select.left, "x")), to = Math.ceil(u.posToVal(u.select.left + u.select.width, "x"));
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    if (to - from >= 60) setRange(card, "custom", from, to);
  }

  function redrawCharts() {
    document.querySelectorAll("[data-chart]").forEach(function (card) {
      var st = chartState(card);
      st.theme = null;  // colours come from CSS variables: rebuild the plots
      drawChart(card);
    });
  }

  function setRange(card, range, from, to) {
    var st = chartState(card);
    st.range = range; st.from = from || null; st.to = to || null;
    pressRange(card, range);
    var u = new URL(location.href);
    ["range", "from", "to"].forEach(function (k) { u.searchParams.delete(k); });
    if (range === "custom") { u.searchParams.set("from", String(st.from)); u.searchParams.set("to", String(st.to)); }
    else u.searchParams.set("range", range);
    history.replaceState(history.state, "", u.toString());
    loadChart(card);
  }

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("[data-range-btn]");
    if (!b) return;
    var card = b.closest("[data-chart]");
    if (card) setRange(card, b.getAttribute("data-range-btn"));
  });
  document.addEventListener("submit", function (ev) {
    var f = ev.target.closest("[data-range-custom]");
    if (!f) return;
    ev.preventDefault();
    var card = f.closest("[data-chart]");
    var from = new Date(f.elements.from.value).getTime() / 1000, to = new Date(f.elements.to.value).getTime() / 1000;
    if (!(from < to)) { summary(card, null, "“To” must be after “From”."); return; }
    setRange(card, "custom", Math.floor(from), Math.ceil(to));
    var det = f.closest("details");
    if (det) det.open = false;
  });

  function initCharts(root) {
    (root || document).querySelectorAll("[data-chart]").forEach(function (card) {
      if (card._lfInit) return;
      card._lfInit = true;
      loadChart(card);
    });
  }
  // Live: the axis of a relative range moves with the clock every second; the data is fetched again when the
  // metrics websocket says a plugin/hook the chart shows moved (at most every 2 s), and in any case every
  // REFRESH_MS (×4 for 24 h, ×20 for 7 d: they move slowly and cost more to read). A custom range is fixed.
  var REFRESH_EVERY = { "15m": 1, "1h": 1, "24h": 4, "7d": 20 };
  var ticks = 0;
  setInterval(function () {
    if (document.visibilityState !== "visible") return;
    document.querySelectorAll("[data-chart]").forEach(function (card) {
      var st = chartState(card);
      if (st.plots.length && st.range !== "custom") followClock(card);
    });
  }, 1000);
  setInterval(function () {
    ticks += 1;
    if (document.visibilityState !== "visible") return;
    document.querySelectorAll("[data-chart]").forEach(function (card) {
      var every = REFRESH_EVERY[chartState(card).range];
      if (every && ticks % every === 0) loadChart(card);
    });
  }, REFRESH_MS);

  function chartConcerns(card, change) {
    var src = new URL(card.getAttribute("data-src"), location.href).searchParams;
    var plugin = src.get("plugin") || "", hook = src.get("hook") || "";
    return change.plugin === "*" || ((!plugin || change.plugin === plugin) && (!hook || change.hook === hook || change.hook === "*"));
  }
  function watchMetrics() {
    if (!document.querySelector("[data-chart]") || !window.WebSocket) return;
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/metrics/?view=chart";
    var sock = new WebSocket(url);
    sock.onmessage = function (ev) {
      var changed;
      try { changed = JSON.parse(ev.data).changed || []; } catch (e) { return; }
      document.querySelectorAll("[data-chart]").forEach(function (card) {
        var st = chartState(card);
        if (st.range === "custom" || st.pendingLoad || !changed.some(function (c) { return chartConcerns(card, c); })) return;
        st.pendingLoad = setTimeout(function () { st.pendingLoad = null; loadChart(card); }, 2000);
      });
    };
    sock.onclose = function (ev) { if (ev.code !== 4401 && ev.code !== 4403) setTimeout(watchMetrics, 3000); };
  }

  function fillTimezone() {
    document.querySelectorAll("[data-tz-offset]").forEach(function (el) {
      if (!el.value) el.value = String(new Date().getTimezoneOffset());
    });
  }

  function init() {
    installSocketFactory();
    document.querySelectorAll("[data-stderr-panel]").forEach(watch);
    syncThemeButtons();
    fillTimezone();
    initCharts(document);
    watchMetrics();
  }
  // The ws extension connects on htmx's load; our factory must be in place first (scripts are deferred in order).
  installSocketFactory();
  document.addEventListener("DOMContentLoaded", init);
  document.addEventListener("htmx:load", function (ev) {
    document.querySelectorAll("[data-stderr-panel]").forEach(watch);
    initCharts(ev.target && ev.target.querySelectorAll ? ev.target : document);
    fillTimezone();
  });
})();
