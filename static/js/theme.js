// Runs before the page paints (not deferred): apply the theme the operator chose with the toggle, if any;
// otherwise the stylesheet follows prefers-color-scheme. static/js/app.js wires the toggle.
(function () {
  "use strict";
  try {
    var saved = localStorage.getItem("lf-theme");
    if (saved === "dark" || saved === "light") document.documentElement.setAttribute("data-theme", saved);
  } catch (e) { /* storage disabled: follow the system */ }
  document.documentElement.classList.add("js");
})();
