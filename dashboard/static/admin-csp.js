// Flask-Admin's menus under the app's Content-Security-Policy (which refuses inline
// script). The server has turned its inline action handlers into data-model-action
// attributes (see admin/views.py); this runs them, and keeps the menus' javascript:
// links from navigating (the browser would refuse them, noisily).
(function () {
  "use strict";

  function ready() {
    // Flask-Admin's page names no language; the app's pages say English.
    if (!document.documentElement.lang) { document.documentElement.lang = "en"; }
    // Its column help icons are links with a title only: give them a name.
    document.querySelectorAll("a[data-role=tooltip][title]").forEach(function (link) {
      if (!link.getAttribute("aria-label")) {
        link.setAttribute("aria-label", "About this column: " + link.getAttribute("title"));
      }
    });
    document.querySelectorAll("[data-model-action]").forEach(function (element) {
      element.addEventListener("click", function (event) {
        event.preventDefault();
        if (window.modelActions) {
          window.modelActions.execute(element.getAttribute("data-model-action"));
        }
      });
    });
    // Capture phase: Flask-Admin's dropdown script stops the toggles' clicks from
    // bubbling, so a bubbling listener would never see them.
    document.addEventListener("click", function (event) {
      var link = event.target.closest && event.target.closest('a[href^="javascript:"]');
      if (link) {
        event.preventDefault();
      }
    }, true);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
