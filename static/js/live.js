// While the live websocket is open, the polled regions stop polling (their triggers check
// body[data-live]); when it closes, polling takes over again.
document.addEventListener("htmx:wsOpen", function () { document.body.dataset.live = "1"; });
document.addEventListener("htmx:wsClose", function () { delete document.body.dataset.live; });
