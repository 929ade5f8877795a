/* A "Copy" button: [data-op-copy] names the field whose value it copies; the element in
   [data-op-copied] says it was done (it is aria-live). Without clipboard access the field
   is selected instead, for the person to copy. */
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-op-copy]");
    if (!button) { return; }
    var field = document.querySelector(button.getAttribute("data-op-copy"));
    var status = document.querySelector("[data-op-copied]");
    if (!field) { return; }
    function said(text) { if (status) { status.textContent = text; } }
    field.focus();
    field.select();
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(field.value).then(function () {
        said("Copied to the clipboard.");
      }, function () { said("Selected: press Ctrl+C (⌘C) to copy."); });
    } else {
      said("Selected: press Ctrl+C (⌘C) to copy.");
    }
  });
}());
