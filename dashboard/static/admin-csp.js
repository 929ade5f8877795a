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
    // Its search box and row checkboxes are named by a placeholder or nothing at all.
    var name = function (selector, words) {
      document.querySelectorAll(selector).forEach(function (input) {
        if (input.type !== "hidden" && !(input.labels && input.labels.length) &&
            !input.getAttribute("aria-label")) {
          input.setAttribute("aria-label", typeof words === "function" ? words(input) : words);
        }
      });
    };
    name("input[name=search]", function (input) {
      return "Search" + (input.placeholder ? " by " + input.placeholder : "");
    });
    name("input[name=rowtoggle]", "Select every row");
    name("input[name=rowid]", function (input) { return "Select row " + input.value; });
    // On a phone a list's rows are cards (theme.css): each cell says its column.
    document.querySelectorAll("table.model-list, .table-responsive > table").forEach(
        function (table) {
      var row = table.querySelector("thead tr:last-child");
      var heads = row ? [].map.call(row.children, function (th) {
        return th.innerText.split("\n")[0].trim();  // its first line: a matrix's label
      }) : [];
      table.querySelectorAll("tbody tr").forEach(function (row) {
        [].forEach.call(row.children, function (cell, n) {
          if (heads[n]) { cell.setAttribute("data-label", heads[n]); }
        });
      });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
