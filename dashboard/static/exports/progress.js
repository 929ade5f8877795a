// The export page while the export is made: ask for its state every two seconds, move
// the progress bar, and reload the page once it is ready or failed.
(function () {
  var box = document.getElementById("export");
  if (!box || ["queued", "running"].indexOf(box.dataset.status) < 0) { return; }
  var bar = document.getElementById("export-progress");
  function poll() {
    fetch(box.dataset.poll, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (state) {
        if (!state) { return; }
        if (bar) { bar.value = state.progress; bar.textContent = state.progress + "%"; }
        if (state.status !== box.dataset.status) { window.location.reload(); return; }
        window.setTimeout(poll, 2000);
      })
      .catch(function () { window.setTimeout(poll, 5000); });
  }
  window.setTimeout(poll, 2000);
})();
