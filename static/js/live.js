// Live pages. With the websocket (a shared channel layer): while it is open the server pushes
// fragments that HTMX swaps out of band; on every open (a reconnect too) the page says which page
// it is and the server answers with a resync. Without one (the embedded default), the page polls
// the same fragments every few seconds.
function livePageMessage() {
  var params = {};
  try { params = JSON.parse(document.body.dataset.liveParams || "{}"); } catch (e) { params = {}; }
  return { watch: document.body.dataset.livePage, params: params };
}
document.addEventListener("htmx:wsOpen", function (event) {
  document.body.dataset.live = "1";
  if (document.body.dataset.livePage) {
    event.detail.socketWrapper.send(JSON.stringify(livePageMessage()));
  }
});
document.addEventListener("htmx:wsClose", function () { delete document.body.dataset.live; });
document.addEventListener("DOMContentLoaded", function () {
  var poll = document.body.dataset.livePoll;
  if (!poll || !document.body.dataset.livePage) { return; }
  setInterval(function () {
    var message = livePageMessage();
    var url = poll + "?page=" + encodeURIComponent(message.watch) + "&params=" + encodeURIComponent(JSON.stringify(message.params));
    htmx.ajax("GET", url, { source: document.body, swap: "none" });
  }, 3000);
});
