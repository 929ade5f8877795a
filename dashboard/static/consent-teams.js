/* The consent page's "which team it will write to" sentence, kept in step with the team
   boxes as they are ticked (the server says the same words for the boxes as sent; this
   only saves a round trip). Each box says its team's words and whether the role saves. */
(function () {
  "use strict";
  var sentence = document.getElementById("acts-for");
  var boxes = document.querySelectorAll("#teams input[name=teams]");
  if (!sentence || !boxes.length) { return; }
  function say() {
    var writes = [], reads = [];
    boxes.forEach(function (box) {
      if (!box.checked) { return; }
      (box.getAttribute("data-writes") === "1" ? writes : reads).push(
        box.getAttribute("data-words"));
    });
    var parts = [];
    if (writes.length) { parts.push("It may save to: " + writes.join(", ") + "."); }
    if (reads.length) { parts.push("It may read, not save to: " + reads.join(", ") + "."); }
    sentence.textContent = parts.length ? parts.join(" ") : "It acts for you alone.";
  }
  boxes.forEach(function (box) { box.addEventListener("change", say); });
}());
