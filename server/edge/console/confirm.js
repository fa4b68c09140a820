// The confirmation dialog (#confirm): every action that cannot be taken back (delete,
// dispose, fork, resume) asks first. Keyboard: the dialog is modal, Escape cancels.
import { $ } from "./notices.js";

/**
 * Ask to confirm `title` (`message` says what happens). With `option` (a label), a
 * checkbox is shown, unticked; with `input` ({ label, value, placeholder, pattern }),
 * a text field. Resolves to null when cancelled, else { option: bool, value: string }.
 */
export function confirmAction({ title, message, confirmLabel, option = "", input = null }) {
  const dialog = $("#confirm");
  $("#confirm-title").textContent = title;
  $("#confirm-message").textContent = message;
  $("#confirm-ok").textContent = confirmLabel;
  const box = $("#confirm-option");
  box.checked = false;
  $("#confirm-option-row").hidden = !option;
  $("#confirm-option-label").textContent = option;
  const field = $("#confirm-input");
  $("#confirm-input-row").hidden = !input;
  $("#confirm-input-label").textContent = input ? input.label : "";
  field.value = input ? input.value || "" : "";
  field.placeholder = input ? input.placeholder || "" : "";
  field.required = Boolean(input && input.required);
  field.disabled = !input; // a hidden field never blocks the form
  if (input && input.pattern) field.pattern = input.pattern;
  else field.removeAttribute("pattern");
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => resolve(dialog.returnValue === "ok" ? { option: Boolean(option) && box.checked, value: field.value.trim() } : null),
      { once: true },
    );
    dialog.showModal();
    (input ? field : $("#confirm-cancel")).focus(); // the safe choice has the focus
  });
}
