// The eye on Blinks (templates/blink/_memory_status.html) without a page reload: the form
// is sent with fetch (format=json, the CSRF token in X-CSRFToken) and the answer flips the
// icon, the label and the state the next click asks for. Without JavaScript, or when the
// fetch fails, the form is submitted as it is (redirect back with a flash message).
(function () {
  "use strict";

  function apply(form, data) {
    var excluded = data.excluded_from_memory === true;
    var read = data.read === true;  // the plan's resolution as well as the switch
    var button = form.querySelector(".uc-memory-status");
    var icon = button.querySelector(".bi");
    icon.classList.toggle("bi-eye", read);
    icon.classList.toggle("bi-eye-slash", !read);
    button.querySelector(".uc-memory-label").textContent = data.label;
    button.setAttribute("data-excluded", excluded ? "true" : "false");
    button.setAttribute("data-read", read ? "true" : "false");
    form.querySelector("input[name=excluded]").value = excluded ? "0" : "1";
    var card = form.closest("[data-blink-id]");
    if (card) {
      card.classList.toggle("uc-blink-excluded", excluded);
    }
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-memory-toggle") ||
        !window.fetch || !window.FormData) {
      return;
    }
    event.preventDefault();
    if (form.getAttribute("aria-busy") === "true") {
      return;
    }
    form.setAttribute("aria-busy", "true");
    var body = new FormData(form);
    body.set("format", "json");
    fetch(form.action, {
      method: "POST",
      body: body,
      credentials: "same-origin",
      headers: {"Accept": "application/json", "X-CSRFToken": body.get("csrf_token")}
    }).then(function (response) {
      if (!response.ok) {
        throw new Error("HTTP " + response.status);
      }
      return response.json();
    }).then(function (data) {
      apply(form, data);
      form.removeAttribute("aria-busy");
    }).catch(function () {
      // The server's own answer (a flash, or a page saying what went wrong).
      form.removeAttribute("aria-busy");
      HTMLFormElement.prototype.submit.call(form);
    });
  });
}());
