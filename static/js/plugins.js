// Page behaviour for the plugin, engine and tokens pages (static/js/app.js holds what every page shares).
(function () {
  "use strict";

  // ---- stack editor: drag-and-drop and keyboard over the comma-separated `stack` field it keeps in sync ----
  function stackNames(input) {
    return input.value.split(/[,\n]/).map(function (s) { return s.trim(); }).filter(Boolean);
  }

  function initStackEditor(field) {
    if (field._stackEditor) return;
    var editor = field.querySelector("[data-stack-editor]");
    var text = field.querySelector("[data-stack-text]");
    var input = field.querySelector("input[name=stack]");
    if (!editor || !input) return;
    field._stackEditor = true;
    var order = editor.querySelector("#stack-order");
    var avail = editor.querySelector("#stack-available");
    var live = editor.querySelector("[data-stack-announce]");
    var tpl = editor.querySelector("template[data-stack-installed]");
    var installed = Array.prototype.map.call(tpl.content.querySelectorAll("[data-name]"), function (el) {
      return el.getAttribute("data-name");
    });
    var dragged = null;

    function say(msg) { live.textContent = msg; }
    function names(list) {
      return Array.prototype.map.call(list.children, function (li) { return li.dataset.name; });
    }
    function sync() {
      input.value = names(order).join(", ");
      Array.prototype.forEach.call(order.children, function (li, i) {
        li.querySelector(".pos").textContent = (i + 1) + ".";
        li.setAttribute("aria-label", li.dataset.name + ", position " + (i + 1) + " of " + order.children.length);
      });
      Array.prototype.forEach.call(avail.children, function (li) {
        li.querySelector(".pos").textContent = "";
        li.setAttribute("aria-label", li.dataset.name + ", not in the stack");
      });
    }
    function button(label, title, action) {
      var b = document.createElement("button");
      b.type = "button";
      b.className = "btn";
      b.textContent = label;
      b.title = title;
      b.setAttribute("aria-label", title);
      b.dataset.action = action;
      b.tabIndex = -1;  // the item itself takes the keyboard; the buttons are for pointers
      return b;
    }
    function item(name) {
      var li = document.createElement("li");
      li.dataset.name = name;
      li.tabIndex = 0;
      li.draggable = true;
      var pos = document.createElement("span");
      pos.className = "pos";
      var label = document.createElement("span");
      label.className = "name";
      label.textContent = name;
      label.title = name;
      li.append(pos, label, button("↑", "Move " + name + " up", "up"), button("↓", "Move " + name + " down", "down"),
        button("±", "Add or remove " + name, "toggle"));
      return li;
    }
    function refreshButtons() {
      Array.prototype.forEach.call(editor.querySelectorAll("li"), function (li) {
        var inStack = li.parentNode === order;
        li.querySelectorAll("[data-action=up],[data-action=down]").forEach(function (b) { b.hidden = !inStack; });
        var t = li.querySelector("[data-action=toggle]");
        t.textContent = inStack ? "Remove" : "Add";
        t.title = (inStack ? "Remove " : "Add ") + li.dataset.name + (inStack ? " from the stack" : " to the stack");
        t.setAttribute("aria-label", t.title);
      });
      sync();
    }
    function move(li, delta) {
      if (li.parentNode !== order) return;
      var sib = delta < 0 ? li.previousElementSibling : li.nextElementSibling;
      if (!sib) return;
      order.insertBefore(li, delta < 0 ? sib : sib.nextElementSibling);
      li.focus();
      refreshButtons();
      say(li.dataset.name + " moved to position " + (names(order).indexOf(li.dataset.name) + 1));
    }
    function toggle(li) {
      var toStack = li.parentNode !== order;
      (toStack ? order : avail).appendChild(li);
      li.focus();
      refreshButtons();
      say(li.dataset.name + (toStack ? " added to the stack at position " + order.children.length
        : " removed from the stack"));
    }

    var current = stackNames(input);
    current.forEach(function (n) { order.appendChild(item(n)); });
    installed.forEach(function (n) { if (current.indexOf(n) < 0) avail.appendChild(item(n)); });

    editor.addEventListener("click", function (ev) {
      var b = ev.target.closest("button[data-action]");
      if (!b) return;
      var li = b.closest("li");
      if (b.dataset.action === "toggle") toggle(li);
      else move(li, b.dataset.action === "up" ? -1 : 1);
    });
    editor.addEventListener("keydown", function (ev) {
      var li = ev.target.closest("li");
      if (!li || ev.target !== li) return;
      if (ev.altKey && (ev.key === "ArrowUp" || ev.key === "ArrowDown")) {
        ev.preventDefault();
        move(li, ev.key === "ArrowUp" ? -1 : 1);
      } else if (ev.key === "ArrowUp" || ev.key === "ArrowDown") {
        ev.preventDefault();
        var next = ev.key === "ArrowUp" ? li.previousElementSibling : li.nextElementSibling;
        if (next) next.focus();
      } else if (ev.key === "Enter" || ev.key === " " || ev.key === "Delete") {
        ev.preventDefault();
        if (ev.key !== "Delete" || li.parentNode === order) toggle(li);
      }
    });
    editor.addEventListener("dragstart", function (ev) {
      var li = ev.target.closest && ev.target.closest("li");
      if (!li) return;
      dragged = li;
      li.classList.add("dragging");
      ev.dataTransfer.effectAllowed = "move";
      ev.dataTransfer.setData("text/plain", li.dataset.name);
    });
    editor.addEventListener("dragend", function () {
      if (dragged) dragged.classList.remove("dragging");
      dragged = null;
      refreshButtons();
    });
    [order, avail].forEach(function (list) {
      list.addEventListener("dragover", function (ev) {
        if (!dragged) return;
        ev.preventDefault();
        var over = ev.target.closest("li");
        if (over && over !== dragged && over.parentNode === list) {
          var box = over.getBoundingClientRect();
          list.insertBefore(dragged, ev.clientY > box.top + box.height / 2 ? over.nextElementSibling : over);
        } else if (!over) {
          list.appendChild(dragged);
        }
      });
      list.addEventListener("drop", function (ev) {
        ev.preventDefault();
        if (dragged) say(dragged.dataset.name + (dragged.parentNode === order
          ? " is at position " + (names(order).indexOf(dragged.dataset.name) + 1) : " removed from the stack"));
        refreshButtons();
      });
    });
    text.hidden = true;
    editor.hidden = false;
    refreshButtons();
  }

  // ---- create form: the install hint of the chosen runtime only ----
  function syncRuntimeHint(select) {
    document.querySelectorAll("[data-runtime-hint]").forEach(function (el) {
      el.hidden = el.getAttribute("data-runtime-hint") !== select.value;
    });
  }

  function init(root) {
    (root.querySelectorAll ? root : document).querySelectorAll("[data-stack-field]").forEach(initStackEditor);
    if (root.matches && root.matches("[data-stack-field]")) initStackEditor(root);
    var runtime = document.getElementById("id_runtime");
    if (runtime && !runtime._hint) {
      runtime._hint = true;
      runtime.addEventListener("change", function () { syncRuntimeHint(runtime); });
      syncRuntimeHint(runtime);
    }
  }

  // ---- the test console keeps keyboard focus on its Run button after a run ----
  var focusAfterRun = null;
  document.addEventListener("htmx:beforeRequest", function (ev) {
    var form = ev.detail.elt && ev.detail.elt.closest && ev.detail.elt.closest("#test-hook-form");
    if (form) focusAfterRun = document.activeElement && form.contains(document.activeElement)
      ? document.activeElement : form.querySelector("button[type=submit]");
  });
  document.addEventListener("htmx:afterSettle", function (ev) {
    if (!focusAfterRun || !ev.detail.target || ev.detail.target.id !== "test-result") return;
    var el = focusAfterRun;
    focusAfterRun = null;
    // the button is re-enabled by htmx (hx-disabled-elt) at about the same time: focus once it is
    setTimeout(function () { if (document.contains(el)) el.focus(); }, 0);
  });

  // ---- plugin list: a sort header also updates the filter form's sort fields, so a later search keeps it ----
  document.addEventListener("click", function (ev) {
    var link = ev.target.closest && ev.target.closest("a.sort-link");
    var form = link && document.querySelector("form.filters");
    if (!form) return;
    var params = new URL(link.href, location.href).searchParams;
    ["sort", "dir"].forEach(function (key) {
      var input = form.querySelector("input[type=hidden][name=" + key + "]");
      if (input && params.has(key)) input.value = params.get(key);
    });
  }, true);

  document.addEventListener("htmx:load", function (ev) { init(ev.detail.elt); });
  if (document.readyState !== "loading") init(document);
  else document.addEventListener("DOMContentLoaded", function () { init(document); });
})();
