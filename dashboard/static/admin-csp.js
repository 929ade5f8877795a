// Flask-Admin writes a few inline event handlers (onclick="...") and javascript: links.
// The app's Content-Security-Policy refuses inline script, so this file turns them into
// ordinary listeners before anyone can click, and keeps javascript: links from navigating.
(function () {
  "use strict";
  var ACTION = /^return modelActions\.execute\('([A-Za-z0-9_]+)'\);?$/;

  function convert(element) {
    var handler = element.getAttribute("onclick") || "";
    element.removeAttribute("onclick");
    var action = ACTION.exec(handler.trim());
    element.addEventListener("click", function (event) {
      event.preventDefault();
      if (action && window.modelActions) {
        window.modelActions.execute(action[1]);
      }
    });
  }

  function ready() {
    document.querySelectorAll("[onclick]").forEach(convert);
    document.addEventListener("click", function (event) {
      var link = event.target.closest && event.target.closest('a[href^="javascript:"]');
      if (link) {
        event.preventDefault();
      }
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
