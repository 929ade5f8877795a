/* The main menu on a narrow screen: the links fold under the "Menu" button, which opens
   and closes them (Bootstrap's CSS, without its script). Without this script nothing
   folds: every link is shown. */
(function () {
  "use strict";
  var toggle = document.querySelector("[data-op-nav-toggle]");
  var menu = document.querySelector("[data-op-nav]");
  if (!toggle || !menu) { return; }
  menu.classList.add("collapse");
  toggle.classList.remove("d-none");
  toggle.addEventListener("click", function () {
    var open = menu.classList.toggle("show");
    toggle.setAttribute("aria-expanded", open ? "true" : "false");
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && menu.classList.contains("show")) {
      menu.classList.remove("show");
      toggle.setAttribute("aria-expanded", "false");
      toggle.focus();
    }
  });
}());
