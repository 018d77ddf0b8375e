// While the live websocket is open, the polled regions stop polling (their triggers check
// body[data-live]); when it closes, polling takes over again. On every open (a reconnect too) the
// page tells the server which page it is, and the server answers with a resync of its fragments.
document.addEventListener("htmx:wsOpen", function (event) {
  document.body.dataset.live = "1";
  var page = document.body.dataset.livePage;
  if (page) {
    var params = {};
    try { params = JSON.parse(document.body.dataset.liveParams || "{}"); } catch (e) { params = {}; }
    event.detail.socketWrapper.send(JSON.stringify({ watch: page, params: params }));
  }
});
document.addEventListener("htmx:wsClose", function () { delete document.body.dataset.live; });
