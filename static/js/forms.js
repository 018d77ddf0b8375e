// Small form behaviours, kept out of the templates so the Content-Security-Policy can forbid
// inline scripts: a <select data-autosubmit> submits its form when it changes.
document.addEventListener("change", function (event) {
  var target = event.target;
  if (target && target.matches && target.matches("select[data-autosubmit]") && target.form) {
    target.form.submit();
  }
});
