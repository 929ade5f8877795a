/* OrbitPilot chat: sending, the eye toggle and Catch without a reload, for the
   full-screen chat and the dock. Every form also works without this script (a plain
   POST, then a redirect); here each is sent with fetch() as JSON instead, with the CSRF
   token in the X-CSRFToken header. Server text is inserted as text, except the message
   HTML the server rendered (and escaped) itself. */
(function () {
  "use strict";

  var DOCK_KEY = "orbitpilot.dock.open";
  var DOCK_KEEP = 8;

  function csrfToken(form) {
    var input = form.querySelector('input[name="csrf_token"]');
    return input ? input.value : "";
  }

  /* The form, sent by fetch with its CSRF token; ``accept`` says what answer to ask for. */
  function post(form, accept) {
    var data = new FormData(form);
    data.set("format", "json");
    return fetch(form.action, {
      method: "POST",
      body: data,
      credentials: "same-origin",
      headers: { "Accept": accept, "X-CSRFToken": csrfToken(form) }
    });
  }

  /* A JSON answer's body, or an Error with its problem's sentence. */
  function readJson(response) {
    return response.json().catch(function () { return {}; }).then(function (body) {
      if (!response.ok) {
        throw new Error(body.detail || "Something went wrong. Try again.");
      }
      return body;
    });
  }

  function postJson(form) {
    return post(form, "application/json").then(readJson);
  }

  /* A send, with the reply streamed in as it is written: server-sent events over the
     fetch's body ("delta" pieces, then "done" with the JSON answer, or "error"). Any
     answer that is not a stream (a guest's, a refusal) is read as JSON. */
  function readEvent(raw) {
    var name = "message", data = [];
    raw.split("\n").forEach(function (line) {
      if (line.indexOf("event:") === 0) { name = line.slice(6).trim(); }
      else if (line.indexOf("data:") === 0) { data.push(line.slice(5).replace(/^ /, "")); }
    });
    return { name: name, data: data.length ? JSON.parse(data.join("\n")) : {} };
  }

  function postStreamed(form, onDelta) {
    return post(form, "text/event-stream").then(function (response) {
      var type = response.headers.get("Content-Type") || "";
      if (!response.ok || type.indexOf("text/event-stream") !== 0 || !response.body) {
        return readJson(response);
      }
      var reader = response.body.getReader();
      var decoder = new TextDecoder();
      var buffer = "";
      return new Promise(function (resolve, reject) {
        function pump() {
          reader.read().then(function (chunk) {
            if (chunk.done) { reject(new Error("The answer was cut off. Try again.")); return; }
            buffer += decoder.decode(chunk.value, { stream: true });
            var end;
            while ((end = buffer.indexOf("\n\n")) >= 0) {
              var event = readEvent(buffer.slice(0, end));
              buffer = buffer.slice(end + 2);
              if (event.name === "delta") { onDelta(event.data.text || ""); }
              else if (event.name === "done") { resolve(event.data); return; }
              else if (event.name === "error") {
                reject(new Error(event.data.detail || "Something went wrong. Try again."));
                return;
              }
            }
            pump();
          }, reject);
        }
        pump();
      });
    });
  }

  /* The exchange as it is being written: the question, then the reply growing; both are
     replaced by the server's own rendering once it is stored. */
  function bubbleOf(role, who, text) {
    var message = document.createElement("div");
    message.className = "op-msg op-msg-" + role + " op-pending";
    message.setAttribute("data-op-pending", "");
    var name = document.createElement("div");
    name.className = "op-who";
    name.textContent = who;
    var bubble = document.createElement("div");
    bubble.className = "op-bubble";
    bubble.textContent = text;
    message.appendChild(name);
    message.appendChild(bubble);
    return message;
  }

  function pendingExchange(question) {
    var asked = bubbleOf("user", "You", question);
    var reply = bubbleOf("assistant", "OrbitPilot", "");
    reply.setAttribute("aria-live", "polite");
    return { nodes: [asked, reply], bubble: reply.querySelector(".op-bubble") };
  }

  function rootOf(element) {
    return element.closest("[data-op-chat-root]") || document;
  }

  function scrollDown(thread) {
    if (thread) { thread.scrollTop = thread.scrollHeight; }
  }

  function setError(form, text) {
    var box = form.querySelector("[data-op-error]");
    if (box) { box.textContent = text || ""; }
  }

  function actionError(form, text) {
    var message = form.closest(".op-msg");
    var box = message && message.querySelector("[data-op-action-error]");
    if (box) { box.textContent = text; box.classList.remove("d-none"); }
  }

  /* -- the eye toggle ------------------------------------------------------------ */
  function showRemembered(message, notRemembered, label) {
    var button = message.querySelector("[data-op-action=remember] button");
    var icon = button && button.querySelector("i");
    if (icon) {
      icon.classList.toggle("bi-eye", !notRemembered);
      icon.classList.toggle("bi-eye-slash", notRemembered);
    }
    if (button) {
      var words = notRemembered ? button.getAttribute("data-label-flagged")
                                : button.getAttribute("data-label-remembered");
      button.setAttribute("aria-label", words);
      button.setAttribute("title", words);
    }
    var flag = message.querySelector("[data-op-flag]");
    if (flag) {
      if (notRemembered) { flag.textContent = label; }
      flag.classList.toggle("d-none", !notRemembered);
    }
    message.classList.toggle("op-flagged", notRemembered);
    message.setAttribute("data-not-remembered", notRemembered ? "true" : "false");
    // The reply that answered it is left out with it: its mark follows (dock and page).
    var id = message.getAttribute("data-message-id");
    document.querySelectorAll('.op-msg[data-answers="' + id + '"] [data-op-covered]')
      .forEach(function (covered) { covered.classList.toggle("d-none", !notRemembered); });
    // The next press asks for the other state.
    var wanted = message.querySelector("[data-op-action=remember] [data-op-wanted]");
    if (wanted) { wanted.value = notRemembered ? "0" : "1"; }
  }

  function onRemember(form) {
    var button = form.querySelector("button");
    button.disabled = true;
    postJson(form).then(function (body) {
      showRemembered(form.closest(".op-msg"), body.not_remembered === true, body.label);
    }).catch(function (error) {
      actionError(form, error.message);
    }).then(function () { button.disabled = false; });
  }

  /* -- Catch: a reply saved as a Blink -------------------------------------------------- */
  function onCatch(form) {
    var button = form.querySelector("button");
    button.disabled = true;
    postJson(form).then(function (body) {
      var icon = button.querySelector("i");
      if (icon) {
        icon.classList.remove("bi-bookmark-star");
        icon.classList.add("bi-bookmark-check-fill");
      }
      button.setAttribute("aria-label", body.label);
      button.setAttribute("title", body.label);
      var done = form.closest(".op-msg").querySelector("[data-op-caught]");
      if (done) {
        done.textContent = "";
        var link = document.createElement("a");
        link.href = body.blink_url;
        link.textContent = body.label;
        done.appendChild(link);
        done.classList.remove("d-none");
      }
    }).catch(function (error) {
      button.disabled = false;
      actionError(form, error.message);
    });
  }

  /* -- sending -------------------------------------------------------------------------- */
  function addConversationLink(root, body) {
    var list = root.querySelector("[data-op-conversations]");
    if (!list || !body.new_conversation) { return; }
    var link = document.createElement("a");
    link.className = "list-group-item list-group-item-action active";
    link.href = body.conversation_url;
    link.setAttribute("aria-current", "page");
    var title = document.createElement("span");
    title.className = "op-conv-title";
    title.textContent = body.conversation_title || "New conversation";
    link.appendChild(title);
    list.insertBefore(link, list.firstChild);
  }

  function onSend(form) {
    var textarea = form.querySelector("textarea");
    var button = form.querySelector("button[type=submit]");
    if (!textarea.value.trim()) {
      setError(form, "Write a message first.");
      textarea.focus();
      return;
    }
    button.disabled = true;
    setError(form, "");
    var root = rootOf(form);
    var thread = root.querySelector("[data-op-thread]");
    var pending = pendingExchange(textarea.value.trim());
    var streamed = window.ReadableStream && window.TextDecoder;
    var sent = streamed ? postStreamed(form, function (text) {
      if (!pending.nodes[0].parentNode) {
        pending.nodes.forEach(function (node) { thread.appendChild(node); });
      }
      pending.bubble.textContent += text;
      scrollDown(thread);
    }) : postJson(form);
    function dropPending() {
      pending.nodes.forEach(function (node) {
        if (node.parentNode) { node.parentNode.removeChild(node); }
      });
    }
    sent.then(function (body) {
      dropPending();
      var empty = thread.querySelector("[data-op-empty]");
      if (empty) { empty.parentNode.removeChild(empty); }
      thread.insertAdjacentHTML("beforeend", body.html);
      if (root.hasAttribute("data-op-dock")) {
        var shown = thread.querySelectorAll(".op-msg");
        for (var i = 0; i < shown.length - DOCK_KEEP; i++) { thread.removeChild(shown[i]); }
      }
      textarea.value = "";
      updateCount(textarea);
      var conversation = form.querySelector("[data-op-conversation]");
      if (conversation && body.conversation_id) { conversation.value = body.conversation_id; }
      // The conversation can now be ended: the page's End button names it and shows.
      var end = root.querySelector("form[data-op-end]");
      if (end && body.conversation_id) {
        end.querySelector("[data-op-end-conversation]").value = body.conversation_id;
        end.hidden = false;
      }
      var open = root.querySelector("[data-op-open-chat]");
      if (open && body.conversation_url) { open.setAttribute("href", body.conversation_url); }
      if (root.hasAttribute("data-op-page") && body.new_conversation && body.conversation_url &&
          window.history && window.history.replaceState) {
        window.history.replaceState(null, "", body.conversation_url);
        addConversationLink(root, body);
      }
      scrollDown(thread);
    }).catch(function (error) {
      dropPending();
      setError(form, error.message);
    }).then(function () {
      button.disabled = false;
      textarea.focus();
    });
  }

  function updateCount(textarea) {
    var counter = textarea.form && textarea.form.querySelector("[data-op-count]");
    var max = parseInt(textarea.getAttribute("data-max-chars"), 10);
    if (!counter || !max) { return; }
    var length = textarea.value.length;
    counter.textContent = length > max * 0.9 ? length + " / " + max : "";
    counter.classList.toggle("op-over", length > max);
  }

  /* -- wiring --------------------------------------------------------------------------- */
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!window.fetch || !window.FormData || !form.matches) { return; }
    if (form.matches("[data-op-composer]")) {
      event.preventDefault();
      onSend(form);
    } else if (form.matches("[data-op-action=remember]")) {
      event.preventDefault();
      onRemember(form);
    } else if (form.matches("[data-op-action=catch]")) {
      event.preventDefault();
      onCatch(form);
    }
  });

  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing ||
        !target.matches || !target.matches("[data-op-composer] textarea")) { return; }
    event.preventDefault();
    var form = target.form;
    if (form.requestSubmit) { form.requestSubmit(); } else { onSend(form); }
  });

  document.addEventListener("input", function (event) {
    if (event.target.matches && event.target.matches("[data-op-composer] textarea")) {
      updateCount(event.target);
    }
  });

  function remember(key, value) {
    try { window.localStorage.setItem(key, value); } catch (e) { /* private mode */ }
  }

  function recall(key) {
    try { return window.localStorage.getItem(key); } catch (e) { return null; }
  }

  function start() {
    var threads = document.querySelectorAll("[data-op-thread]");
    for (var i = 0; i < threads.length; i++) { scrollDown(threads[i]); }
    var dock = document.querySelector("details[data-op-dock]");
    if (dock) {
      if (recall(DOCK_KEY) === "1") { dock.open = true; }
      dock.addEventListener("toggle", function () {
        remember(DOCK_KEY, dock.open ? "1" : "0");
        if (dock.open) { scrollDown(dock.querySelector("[data-op-thread]")); }
      });
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
