// A pending approval's entry in the session page: what waits, who asked, until when,
// with Approve and Reject.
import { h, millis } from "./session.js";

/** One pending approval: what waits, who asked, until when; Approve and Reject. */
export function approvalEntry(owner, a) {
  const id = a.approvalId;
  const key = id.replace(/[^A-Za-z0-9_-]/g, "_");
  const expires = a.expireTime ? new Date(millis(a.expireTime)) : null;
  const reason = h("input", { id: `reject-reason-${key}`, class: "reject-reason", type: "text", maxlength: 4096, autocomplete: "off" });
  const approve = h("button", { type: "button", class: "approve", id: `approve-${key}` }, "Approve (allow once)");
  const reject = h("button", { type: "button", class: "reject", id: `reject-${key}` }, "Reject");
  const busy = (on) => { approve.disabled = on; reject.disabled = on; };
  approve.addEventListener("click", async () => {
    busy(true);
    await owner.resolve(id, "APPROVAL_DECISION_ALLOW_ONCE", "");
    busy(false);
  });
  reject.addEventListener("click", async () => {
    busy(true);
    await owner.resolve(id, "APPROVAL_DECISION_REJECT", reason.value.trim());
    busy(false);
  });
  reason.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      reject.click();
    }
  });
  const where = h("a", { href: `#/session/${encodeURIComponent(owner.sessionId)}` }, `turn ${a.turn || "?"}, step ${a.step || "?"}`);
  const requested = owner.events.find((e) => e.approvalRequested && e.approvalRequested.approvalId === id);
  if (requested) where.href = `#/session/${encodeURIComponent(owner.sessionId)}?seq=${requested.seq}`;
  const refusal = owner.refused.get(id);
  return h(
    "article", { class: "approval", "data-approval": id, "aria-labelledby": `approval-title-${key}` },
    h("h4", { id: `approval-title-${key}` }, "Tool ", h("code", { class: "approval-tool" }, a.toolName || "?"), " waits for approval"),
    h("dl", {},
      h("dt", {}, "Arguments"), h("dd", {}, h("pre", { class: "approval-args" }, prettyJson(a.arguments))),
      h("dt", {}, "Reason"), h("dd", { class: "approval-reason" }, a.reason || "none given"),
      h("dt", {}, "Asked by"), h("dd", { class: "approval-by" }, a.requestedBy || "unknown"),
      h("dt", {}, "Expires"), h("dd", {}, expires ? h("time", { datetime: a.expireTime }, expires.toLocaleString()) : "never"),
      h("dt", {}, "Where"), h("dd", {}, where, ` · call ${a.callId || "?"}`),
    ),
    refusal ? h("p", { class: "refusal", role: "alert" }, refusal) : null,
    h("div", { class: "buttons" },
      approve,
      h("label", { for: `reject-reason-${key}` }, "Rejection reason (optional)"),
      reason,
      reject,
    ),
  );
}

function prettyJson(text) {
  if (!text) return "";
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}
