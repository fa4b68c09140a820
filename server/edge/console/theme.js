// Light or dark: the system's choice (prefers-color-scheme) unless the person picks one
// in #theme; the pick is kept in localStorage and set as <html data-theme>.
import { $ } from "./notices.js";

const KEY = "agentloop.theme";
const CHOICES = ["system", "light", "dark"];

function apply(choice) {
  if (choice === "system") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = choice;
}

/** Apply the stored choice and wire the picker (once). */
export function startTheme() {
  const stored = localStorage.getItem(KEY);
  const choice = CHOICES.includes(stored) ? stored : "system";
  const picker = $("#theme");
  picker.value = choice;
  apply(choice);
  picker.addEventListener("change", () => {
    localStorage.setItem(KEY, picker.value);
    apply(picker.value);
  });
}
