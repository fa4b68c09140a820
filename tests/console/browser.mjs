// Drives the web console in a real headless Chromium (Debian's /usr/bin/chromium) with
// playwright-core, against a server tests/e2e/test_console_browser.py started.
// Environment: CONSOLE_URL, CONSOLE_TOKEN, SCREENSHOT (a .png path), PROFILE_DIR.
// Exits non-zero, naming the failed step, when the console does not behave.
import { chromium } from "playwright-core";

const url = process.env.CONSOLE_URL;
const token = process.env.CONSOLE_TOKEN;
const screenshot = process.env.SCREENSHOT;
const TIMEOUT = 15000;

// A fresh profile (--user-data-dir) per run: playwright passes PROFILE_DIR as it.
const context = await chromium.launchPersistentContext(process.env.PROFILE_DIR, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1280, height: 900 },
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const results = {};
let failed = 0;

async function step(name, body) {
  try {
    const started = Date.now();
    await body();
    console.log(`ok - ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  } catch (error) {
    failed += 1;
    console.log(`not ok - ${name}\n  ${String(error.stack || error).split("\n").slice(0, 6).join("\n  ")}`);
    throw error;
  }
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

/** A call of the JSON API, as any HTTP client makes it (for setups the page lacks). */
async function api(method, body) {
  const response = await fetch(`${url}api/${method}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
    body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) throw new Error(`${method}: ${JSON.stringify(answer)}`);
  return answer;
}

try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(TIMEOUT);
  const consoleErrors = [];
  page.on("pageerror", (error) => consoleErrors.push(String(error)));
  const notice = page.locator("#notice");

  await step("a wrong token shows a clear message", async () => {
    await page.goto(url);
    await page.fill("#token", "not-the-token");
    await page.click("#token-form button");
    await notice.filter({ hasText: "refused the token" }).waitFor();
    const text = await notice.textContent();
    expect(text.includes("UNAUTHENTICATED") && text.includes("wrong token"), `notice: ${text}`);
    results.wrongToken = text;
  });

  await step("the right token lists the agents", async () => {
    await page.fill("#token", token);
    await page.press("#token", "Enter"); // keyboard: the form submits
    await notice.waitFor({ state: "hidden" });
    await page.locator("#agents-updated", { hasText: "live" }).waitFor();
  });

  await step("create an agent from the page", async () => {
    if (!(await page.locator("#create").evaluate((n) => n.open))) await page.click("#create summary");
    await page.fill("#create-id", "browser-demo");
    await page.fill("#create-tools", "word_count");
    await page.fill("#create-window", "8000");
    await page.click("#create-form button[type=submit]");
    await page.waitForURL(/#\/agent\/browser-demo$/);
    await page.locator("#agents tr[data-agent='browser-demo']").waitFor();
    await page.locator("#session-title", { hasText: "Agent browser-demo" }).waitFor();
    // No provider nor model given: the server's defaults, as the server resolved them.
    const model = await page.locator("#agents tr[data-agent='browser-demo'] td.model").textContent();
    expect(model === "scripted / echo (server default)", `provider / model of browser-demo: ${model}`);
  });

  await step("send a message: the tool call, the streamed answer, the turn completed", async () => {
    await page.fill("#act-text", "count the words of this sentence please");
    await page.click("#act-form button[value=send]");
    const tool = page.locator("#turns .ev.tool", { hasText: "word_count" });
    await tool.waitFor();
    await tool.locator(".tool-state", { hasText: "done" }).waitFor();
    const result = await tool.locator(".result pre").textContent();
    expect(result.trim().length > 0, "the tool result is empty");
    const turn = page.locator("#turns details.turn[data-end='completed']");
    await turn.waitFor();
    const summary = await turn.locator(":scope > summary").textContent();
    expect(summary.includes("completed"), `turn summary: ${summary}`);
    const header = await turn.locator(".ev.header").first().textContent();
    expect(header.includes("request header (initial)") && header.includes("scripted/echo"), header);
    const answer = await turn.locator(".ev.assistant .text").last().textContent();
    expect(answer.trim().length > 0, "no streamed answer");
    results.answer = answer;
    results.result = result;
    const seqs = await page.locator("#turns [data-seq]").evaluateAll((nodes) =>
      nodes.map((n) => Number(n.getAttribute("data-seq"))));
    expect(seqs.length > 5 && seqs.every((s) => s > 0), `seqs: ${seqs}`);
  });

  await step("turn and step durations, token totals and their cost per turn, step and session", async () => {
    const turn = page.locator("#turns details.turn[data-end='completed']").first();
    const figures = await turn.locator(".turn-figures").textContent();
    const cost = / · cost (\d+\.\d{6}) USD$/;
    expect(/^\d+\.\d{3} s · \d+ in, \d+ out tokens · cost/.test(figures), `turn figures: ${figures}`);
    const steps = await turn.locator(".step-figures").allTextContents();
    expect(steps.length === 2 && steps.every((t) => /^· \d+\.\d{3} s · \d+ in, \d+ out tokens · cost/.test(t)), `steps: ${steps}`);
    const totals = await page.locator("#session-tokens").textContent();
    expect(/^Tokens: \d+ in, \d+ out in 1 ended turns · cost/.test(totals), `session totals: ${totals}`);
    // The config prices scripted/echo at 2.5 per million input tokens, 10 per million output.
    for (const shown of [figures, ...steps, totals]) {
      const [, input, output] = shown.match(/(\d+) in, (\d+) out/).map(Number);
      const [, amount] = shown.match(cost);
      const expected = ((input * 2.5 + output * 10) / 1e6).toFixed(6);
      expect(amount === expected, `${shown}: cost ${amount}, tokens × price ${expected}`);
    }
    results.turnFigures = figures;
    results.stepFigures = steps;
    results.sessionTokens = totals;
  });

  await step("a context gauge per agent: in the agents list and on the agent's page", async () => {
    const gauge = page.locator("#session-context .context-gauge");
    await page.waitForFunction(() => {
      const node = document.querySelector("#session-context .context-gauge");
      return node && Number(node.dataset.used) > 0;
    });
    expect(await gauge.getAttribute("data-window") === "8000", `window: ${await gauge.getAttribute("data-window")}`);
    const words = await gauge.textContent();
    expect(/\d+ \/ 8k tokens \(\d+%\)/.test(words), `gauge: ${words}`);
    expect(await gauge.locator("meter").getAttribute("max") === "8000", "the meter's max is not the window");
    const row = page.locator("#agents tr[data-agent='browser-demo'] td.context .context-gauge");
    await row.locator("meter").waitFor();
    const listed = await row.textContent();
    expect(listed.includes("/ 8k tokens"), `agents list gauge: ${listed}`);
    results.gauge = words;
  });

  await step("each event shows its seq on hover", async () => {
    const row = page.locator("#turns .ev.user").first();
    const title = await row.getAttribute("title");
    expect(/^seq \d+/.test(title), `title: ${title}`);
    results.userSeq = Number(await row.getAttribute("data-seq"));
  });

  await step("a link opens the page at a session and seq", async () => {
    const href = await page.locator("#turns .ev.user > a.seq").first().getAttribute("href");
    expect(href.startsWith("#/session/browser-demo-session-") && href.endsWith(`?seq=${results.userSeq}`), href);
    const fresh = await context.newPage(); // a new tab: no token yet (sessionStorage)
    fresh.setDefaultTimeout(TIMEOUT);
    await fresh.goto(`${url}${href}`);
    await fresh.locator("#notice", { hasText: "missing token" }).waitFor();
    await fresh.fill("#token", token);
    await fresh.press("#token", "Enter");
    const target = fresh.locator(`#turns .ev.target[data-seq='${results.userSeq}']`);
    await target.waitFor();
    expect(await target.evaluate((n) => n === document.activeElement), "the target has no focus");
    await fresh.close();
  });

  await step("parallel tool calls in model order, steering and context where they landed", async () => {
    const script = {
      "@type": "type.googleapis.com/agentloop.v1.ScriptedOptions",
      steps: [
        {
          toolCalls: [
            { name: "sleep", arguments: '{"seconds": 4}' },
            { name: "sleep", arguments: '{"seconds": 1}' },
            { name: "word_count", arguments: '{"text": "three little words"}' },
            { name: "sleep", arguments: '{"seconds": "long"}' },
          ],
        },
        { text: "Both naps are over, and the text has three words.", chunkDelay: "0.02s", chunkSize: 4 },
      ],
    };
    await page.goto(`${url}#/`);
    if (!(await page.locator("#create").evaluate((n) => n.open))) await page.click("#create summary");
    await page.fill("#create-id", "browser-parallel");
    await page.fill("#create-tools", "sleep, word_count");
    await page.fill("#create-options", JSON.stringify(script));
    await page.click("#create-form button[type=submit]");
    await page.waitForURL(/#\/agent\/browser-parallel$/);
    await page.locator("#session-title", { hasText: "Agent browser-parallel" }).waitFor();
    await page.fill("#act-text", "nap twice, then count");
    await page.click("#act-form button[value=send]");
    await page.locator("#turns .ev.tool").first().waitFor();
    await page.fill("#act-text", "and keep it short");
    await page.click("#act-form button[value=steer]");
    // Typing on while the steer is answered keeps what was typed (the page clears only
    // the text it sent); the inject below is sent after the steer either way.
    await page.fill("#act-text", "the user reads this in a browser");
    await page.click("#act-form button[value=inject]");
    const turn = page.locator("#turns details.turn[data-end='completed']");
    await turn.waitFor();
    const names = await turn.locator(".ev.tool .tool-name").allTextContents();
    expect(names.join(",") === "sleep,sleep,word_count,sleep", `tools in model order: ${names}`);
    await turn.locator(".ev.tool.failed .tool-state", { hasText: "failed" }).waitFor();
    // Both were sent while the 4 s sleep ran, so they land between the two steps; on a
    // machine too slow for that they land later (steering then as a message): either
    // way the page shows them where they landed.
    await page.locator("#turns .ev.steering, #turns .ev.user", { hasText: "and keep it short" }).waitFor();
    await page.locator("#turns .ev.context", { hasText: "the user reads this in a browser" }).waitFor();
    const bars = await turn.locator(".ev.tool .bar").count();
    expect(bars === 4, `timeline bars: ${bars}`);
    // Each call's own run, as the server stored it (checked against the log after).
    results.parallelTimings = await turn.locator(".ev.tool .timing").allTextContents();
    expect(results.parallelTimings.every((t) => /^ran \d+\.\d{3} s from \+\d+\.\d{3} s/.test(t)), `timings: ${results.parallelTimings}`);
  });

  await step("a screenshot of the session view", async () => {
    await page.locator("#turns details.turn[data-end='completed']").waitFor();
    await page.locator("#session-status", { hasText: "idle" }).waitFor();
    await page.screenshot({ path: screenshot, fullPage: true });
  });

  await step("cancel a slow turn: the turn ends aborted", async () => {
    const slow = {
      "@type": "type.googleapis.com/agentloop.v1.ScriptedOptions",
      steps: [{ text: "a slow answer, one character at a time, ".repeat(10), chunkDelay: "0.1s", chunkSize: 1 }],
    };
    await page.goto(`${url}#/`);
    if (!(await page.locator("#create").evaluate((n) => n.open))) await page.click("#create summary");
    await page.fill("#create-id", "browser-slow");
    await page.fill("#create-tools", "");
    await page.fill("#create-options", JSON.stringify(slow));
    await page.click("#create-form button[type=submit]");
    await page.waitForURL(/#\/agent\/browser-slow$/);
    await page.locator("#session-title", { hasText: "Agent browser-slow" }).waitFor();
    await page.fill("#act-text", "take your time");
    await page.click("#act-form button[value=send]");
    const text = page.locator("#turns .ev.assistant .text").last();
    await page.waitForFunction(() => {
      const node = [...document.querySelectorAll("#turns .ev.assistant .text")].pop();
      return node && node.textContent.length >= 3;
    });
    const partial = (await text.textContent()).length;
    await page.locator("#session-status", { hasText: "running" }).waitFor();
    await page.focus("#cancel-turn");
    await page.keyboard.press("Enter"); // keyboard: cancel
    const turn = page.locator("#turns details.turn[data-end='aborted']");
    await turn.waitFor();
    const summary = await turn.locator(":scope > summary").textContent();
    expect(summary.includes("aborted") && summary.includes("cancelled from the console"), summary);
    results.partial = partial;
    results.aborted = summary;
  });

  await step("approve a pending tool call from the page, reject another with a reason", async () => {
    const script = {
      "@type": "type.googleapis.com/agentloop.v1.ScriptedOptions",
      steps: [
        { toolCalls: [{ name: "word_count", arguments: '{"text": "approve these four words"}' }] },
        { toolCalls: [{ name: "word_count", arguments: '{"text": "reject this one"}' }] },
        { text: "One count ran and one was refused." },
      ],
    };
    await page.goto(`${url}#/`);
    if (!(await page.locator("#create").evaluate((n) => n.open))) await page.click("#create summary");
    await page.fill("#create-id", "browser-approval");
    await page.fill("#create-tools", "word_count");
    await page.fill("#create-approval", "word_count");
    await page.fill("#create-options", JSON.stringify(script));
    await page.click("#create-form button[type=submit]");
    await page.waitForURL(/#\/agent\/browser-approval$/);
    await page.locator("#session-title", { hasText: "Agent browser-approval" }).waitFor();
    await page.fill("#act-text", "count, with my approval");
    await page.click("#act-form button[value=send]");

    // The first call waits: the entry, the event where it landed, the derived status.
    const entry = page.locator("#approvals .approval").first();
    await entry.waitFor();
    const shown = await entry.textContent();
    for (const word of ["word_count", "approve these four words", "options.approval_required_tools", "Expires", "turn 1, step 1"]) {
      expect(shown.includes(word), `the pending approval lacks "${word}": ${shown}`);
    }
    await page.locator("#turns .ev.tool .ev.approval-requested", { hasText: "word_count" }).waitFor();
    await page.locator("#session-status", { hasText: "waiting for approval" }).waitFor();
    await page.locator("#agents tr[data-agent='browser-approval'] td.status", { hasText: "waiting for approval" }).waitFor();
    results.pendingApproval = shown;
    await page.screenshot({ path: screenshot.replace(/\.png$/, "-approval.png"), fullPage: true });

    // A second tab shows the same approval, its live stream cut (so it cannot learn of
    // the answer): its own answer, after this tab's, is refused and says so.
    const stale = await context.newPage();
    stale.setDefaultTimeout(TIMEOUT);
    await stale.route("**/agentloop.v1.AgentService/StreamSessionEvents", (route) => route.abort());
    await stale.goto(`${url}#/agent/browser-approval`);
    await stale.fill("#token", token);
    await stale.press("#token", "Enter");
    await stale.locator("#approvals .approval", { hasText: "approve these four words" }).waitFor();

    // Approve from the keyboard: the tool runs.
    await entry.locator("button.approve").focus();
    await page.keyboard.press("Enter");
    const first = page.locator("#turns .ev.tool").first();
    await first.locator(".ev.approval-resolved", { hasText: "allowed once by api:console" }).waitFor();
    await first.locator(".tool-state", { hasText: "done" }).waitFor();
    results.approvedResult = await first.locator(".result pre").textContent();
    expect(results.approvedResult.includes("4 words"), `approved result: ${results.approvedResult}`);
    await stale.locator("#approvals .approval", { hasText: "approve these four words" }).locator("button.approve").click();
    const refusal = stale.locator("#notice", { hasText: "FAILED_PRECONDITION" });
    await refusal.waitFor();
    results.staleRefusal = await refusal.textContent();
    expect(results.staleRefusal.includes("APPROVAL_RESOLVED"), results.staleRefusal);
    await stale.close();

    // The second call waits; reject it with a reason: the denial text is the tool result.
    const second = page.locator("#approvals .approval", { hasText: "reject this one" });
    await second.waitFor();
    await second.locator("input.reject-reason").fill("not this one");
    await second.locator("button.reject").click();
    const denied = page.locator("#turns .ev.tool").nth(1);
    await denied.locator(".ev.approval-resolved", { hasText: "rejected by api:console: not this one" }).waitFor();
    await denied.locator(".tool-state", { hasText: "failed" }).waitFor();
    results.rejectedResult = await denied.locator(".result pre").textContent();
    expect(results.rejectedResult.includes('the user rejected tool "word_count": not this one'), results.rejectedResult);

    const turn = page.locator("#turns details.turn[data-end='completed']");
    await turn.waitFor();
    await page.locator("#approvals").waitFor({ state: "hidden" });
    await page.locator("#session-status", { hasText: "idle" }).waitFor();
    await page.locator("#agents tr[data-agent='browser-approval'] td.status", { hasText: "idle" }).waitFor();
  });

  await step("older events are paged in from the server", async () => {
    await page.goto(`${url}#/agent/browser-demo?page=8`);
    const older = page.locator("#load-older");
    await older.waitFor();
    await page.locator("#turns .partial").first().waitFor();
    const first = () => page.locator("#turns [data-seq]").first().getAttribute("data-seq");
    expect(Number(await first()) > 1, "the first page starts at seq 1");
    for (let i = 0; i < 20 && (await older.isVisible()); i += 1) {
      const before = Number(await first());
      await older.focus();
      await page.keyboard.press("Enter");
      await page.waitForFunction(
        (seq) => Number(document.querySelector("#turns [data-seq]").getAttribute("data-seq")) < seq,
        before,
      );
    }
    expect(Number(await first()) === 1, `after paging, the first seq is ${await first()}`);
    await page.locator("#turns details.turn[data-end='completed']").first().waitFor({ state: "attached" });
  });

  await step("a malformed route shows a notice, and a notice leaves with its view", async () => {
    await page.goto(`${url}#/session/%E0%A4%A`); // not valid %-encoding: decodeURIComponent throws
    await notice.filter({ hasText: "is not a page of the console" }).waitFor();
    expect(await page.locator("#home-view").isVisible(), "the agents view is not shown");
    expect(consoleErrors.length === 0, `script errors: ${consoleErrors.join("\n")}`);
    await page.goto(`${url}#/session/no-such-session`);
    await notice.filter({ hasText: "Opening the session failed" }).waitFor();
    results.missingSession = await notice.textContent();
    await page.goto(`${url}#/plugins`);
    await notice.waitFor({ state: "hidden" }); // the session view's notice went with it
    await page.goto(`${url}#/agent/browser-demo`);
    await page.locator("#turns [data-seq]").first().waitFor();
    expect(await notice.isHidden(), `a notice stayed: ${await notice.textContent()}`);
  });

  await step("the plugins view shows state, subscriptions, counters and latencies", async () => {
    await page.goto(`${url}#/plugins`);
    const source = page.locator("#tool-sources .tool-source[data-source='box']");
    await source.locator(".source-state", { hasText: "ready" }).waitFor();
    const listed = await source.textContent();
    for (const word of ["stdio", "mcp__box__echo", "mcp__box__add", "Last error"]) {
      expect(listed.includes(word), `the MCP server view lacks "${word}": ${listed}`);
    }
    results.toolSource = listed;
    const plugin = page.locator(`#plugins .plugin[data-plugin='${process.env.CONSOLE_PLUGIN}']`);
    await plugin.waitFor();
    const text = await plugin.textContent();
    for (const word of ["ready", "Subscriptions", "fail-opens 0", "dropped 0", "skipped 0", "p50", "p99"]) {
      expect(text.includes(word), `the plugin view lacks "${word}": ${text}`);
    }
    expect(/calls [1-9]/.test(text), `no calls counted: ${text}`);
    results.plugin = text;
  });

  await step("fork after a turn, resume the fork as an agent, dispose it: each confirmed", async () => {
    await page.goto(`${url}#/agent/browser-demo`);
    const fork = page.locator("#turns details.turn[data-end='completed'] .ev.turn-end button.fork").first();
    await fork.click();
    await page.fill("#confirm-input", "browser-demo-fork");
    await page.click("#confirm-ok");
    await page.waitForURL(/#\/session\/browser-demo-fork$/);
    await page.locator("#session-title", { hasText: "Session browser-demo-fork" }).waitFor();
    await notice.filter({ hasText: "Forked after seq" }).waitFor();
    await page.locator("#turns details.turn[data-end='completed']").waitFor();
    expect(await page.locator("#dispose-agent").isHidden(), "dispose offered for a session no agent drives");
    await page.click("#resume-session");
    await page.fill("#confirm-input", "browser-fork-agent");
    await page.click("#confirm-ok");
    await page.waitForURL(/#\/agent\/browser-fork-agent$/);
    await page.locator("#session-title", { hasText: "Agent browser-fork-agent" }).waitFor();
    await page.fill("#act-text", "count these words again");
    await page.click("#act-form button[value=send]");
    await page.locator("#turns details.turn[data-turn='2'][data-end='completed']").waitFor();
    await page.click("#compact-agent"); // a manual compaction, with instructions, confirmed
    await page.locator("#confirm-title", { hasText: "Compact agent browser-fork-agent?" }).waitFor();
    await page.fill("#confirm-input", "focus on the word counts");
    await page.click("#confirm-ok");
    const compacted = notice.filter({ hasText: /Compacted at seq \d+|Not compacted: ./ });
    await compacted.first().waitFor();
    results.compact = await compacted.first().textContent();
    await page.click("#dispose-agent");
    await page.locator("#confirm-title", { hasText: "Dispose agent browser-fork-agent?" }).waitFor();
    await page.click("#confirm-ok");
    await page.locator("#session-status", { hasText: "disposed" }).waitFor();
    await notice.filter({ hasText: "Agent browser-fork-agent disposed" }).waitFor();
    await page.locator("#agents tr[data-agent='browser-fork-agent']").waitFor({ state: "detached" });
    await page.locator("#resume-session").waitFor(); // the stored session can be resumed again
  });

  await step("the tree of work: sub-agents under their parent, delegate calls link to the child", async () => {
    const scripted = (steps) => ({ provider: "scripted", providerOptions: { "@type": "type.googleapis.com/agentloop.v1.ScriptedOptions", steps } });
    const lead = scripted([
      {
        toolCalls: [
          { id: "d1", name: "delegate", arguments: '{"task": "first", "profile": "quick"}' },
          { id: "d2", name: "delegate", arguments: '{"task": "second", "mode": "background", "profile": "slow"}' },
        ],
      },
      { text: "the lead is done" },
    ]);
    lead.tools = ["delegate", "collect"];
    lead.subagentProfiles = {
      quick: scripted([{ text: "alpha answer" }]),
      slow: scripted([{ text: "beta answer, slowly", chunkDelay: "0.1s", chunkSize: 2 }]),
    };
    await api("agentloop.v1.AgentFactoryService/CreateAgent", { agentId: "browser-lead", options: lead });
    await page.goto(`${url}#/agent/browser-lead`);
    await page.locator("#session-title", { hasText: "Agent browser-lead" }).waitFor();
    await page.fill("#act-text", "split the work");
    await page.click("#act-form button[value=send]");
    await page.locator("#turns details.turn[data-end='completed']").waitFor();
    // The foreground child answered: its call links to its session, for good.
    const first = page.locator("#turns .ev.tool[data-call='d1'] .child");
    await first.locator("a.child-session").waitFor();
    const told = await first.textContent();
    expect(told.includes("browser-lead.d1") && told.includes("completed after 1 steps") && !told.includes("null"), told);
    expect(await first.getAttribute("data-state") === "completed", `d1: ${await first.getAttribute("data-state")}`);
    // The background child runs on: its progress arrives live, then its end.
    const second = page.locator("#turns .ev.tool[data-call='d2'] .child[data-state='completed']");
    await second.waitFor();
    expect((await second.textContent()).includes("beta answer"), await second.textContent());
    // It stays live, owned by the lead: listed under it, and on the lead's page.
    const rows = page.locator("#agents tbody tr");
    await page.locator("#agents tr[data-agent='browser-lead.d2'][data-parent='browser-lead'][data-depth='1']").waitFor();
    const order = await rows.evaluateAll((nodes) => nodes.map((n) => n.dataset.agent));
    expect(order.indexOf("browser-lead.d2") === order.indexOf("browser-lead") + 1, `order: ${order}`);
    const leadModel = await page.locator("#agents tr[data-agent='browser-lead'] td.model").textContent();
    expect(leadModel === "scripted / echo (provider default)", `provider / model of browser-lead: ${leadModel}`);
    await page.locator("#children li[data-child='browser-lead.d2']", { hasText: "idle" }).waitFor();
    results.leadSession = (await page.locator("#session-id").textContent()).replace("session ", "");
    await page.screenshot({ path: screenshot.replace(/\.png$/, "-tree.png"), fullPage: true });
    // The link leads to the child's whole session.
    const href = await first.locator("a.child-session").getAttribute("href");
    results.childSession = decodeURIComponent(href.split("/").pop());
    await first.locator("a.child-session").click();
    await page.locator("#session-title", { hasText: `Session ${results.childSession}` }).waitFor();
    await page.locator("#turns details.turn[data-end='completed'] .ev.assistant", { hasText: "alpha answer" }).waitFor();
  });

  await step("delete a stored session, after a confirmation", async () => {
    // The child answered and was disposed: its session is stored, no agent on it.
    await page.click("#delete-session");
    const dialog = page.locator("#confirm");
    await dialog.waitFor();
    expect(await page.locator("#confirm-option-row").isHidden(), "a dispose option for a session no agent drives");
    await page.click("#confirm-cancel"); // cancelled: nothing happens
    await dialog.waitFor({ state: "hidden" });
    expect(page.url().includes(`#/session/${results.childSession}`), page.url());
    await page.click("#delete-session");
    await page.click("#confirm-ok");
    await page.waitForURL(/#\/$/);
    await notice.filter({ hasText: `Session ${results.childSession} deleted` }).waitFor();
    results.deletedChild = await notice.textContent();
  });

  await step("a delete is refused while an agent is live on the session, unless it is disposed first", async () => {
    await page.goto(`${url}#/agent/browser-lead`);
    await page.locator("#turns details.turn[data-end='completed']").waitFor();
    await page.click("#delete-session");
    await page.locator("#confirm-option-label", { hasText: "Dispose agent browser-lead first" }).waitFor();
    await page.click("#confirm-ok"); // the option left unticked
    await notice.filter({ hasText: "SESSION_IN_USE" }).or(notice.filter({ hasText: "Not deleted" })).waitFor();
    results.refusedDelete = await notice.textContent();
    expect(results.refusedDelete.includes("browser-lead"), results.refusedDelete);
    await page.locator("#agents tr[data-agent='browser-lead']").waitFor(); // still live
    await page.click("#delete-session");
    await page.check("#confirm-option");
    await page.click("#confirm-ok");
    await page.waitForURL(/#\/$/);
    await notice.filter({ hasText: "agent browser-lead disposed first" }).waitFor();
    results.deletedLead = await notice.textContent();
    await page.locator("#agents tr[data-agent='browser-lead']").waitFor({ state: "detached" });
    await page.locator("#agents tr[data-agent='browser-lead.d2']").waitFor({ state: "detached" });
  });

  await step("the sessions: searched and filtered by the server, paged from it", async () => {
    const rows = () => page.locator("#sessions tbody tr[data-session]").evaluateAll((nodes) => nodes.map((n) => n.dataset.session));
    const listedAt = async (hash) => {
      await page.goto(`${url}${hash}`);
      await page.waitForFunction((h) => document.querySelector("#sessions").dataset.listed === h, hash);
      return rows();
    };
    const all = await listedAt("#/sessions");
    expect(all.some((i) => i.startsWith("browser-demo-session-")) && all.includes("browser-demo-fork"), `all: ${all}`);
    expect(!all.includes(results.childSession) && !all.includes(results.leadSession), `a deleted session is listed: ${all}`);
    results.allSessions = all;
    // The cost column: priced on demand from the session's events and the price table.
    const demoRow = page.locator("#sessions tbody tr[data-session^='browser-demo-session-']");
    await demoRow.getByRole("button", { name: /^Price session browser-demo-session-/ }).click();
    await demoRow.locator("td.cost[data-priced]").waitFor();
    results.listedCost = await demoRow.locator("td.cost").textContent();
    // From the form: the stored ones only (the fork's agent was disposed).
    await page.selectOption("#sessions-state", "stored");
    await page.click("#sessions-form button[type=submit]");
    await page.waitForFunction(() => document.querySelector("#sessions").dataset.listed === "#/sessions?state=stored");
    const stored = await rows();
    expect(stored.includes("browser-demo-fork") && !stored.some((i) => i.startsWith("browser-demo-session-")), `stored: ${stored}`);
    const slow = await listedAt("#/sessions?end=aborted");
    expect(slow.length === 1 && slow[0].startsWith("browser-slow-session-"), `aborted: ${slow}`);
    const row = page.locator("#sessions tbody tr[data-session]").first();
    expect((await row.locator("td.end").textContent()) === "aborted", await row.textContent());
    const found = await listedAt("#/sessions?q=DEMO-FORK&agent=browser-fork-agent");
    expect(found.join() === "browser-demo-fork", `search: ${found}`);
    expect(await page.inputValue("#sessions-q") === "DEMO-FORK", "the form does not show the route's filters");
    // Two at a time: "load more" pages in the rest from the server.
    await page.goto(`${url}#/sessions?size=2`);
    const more = page.locator("#sessions-more");
    await more.waitFor();
    for (let i = 0; i < 20 && (await more.isVisible()); i += 1) {
      const before = (await rows()).length;
      await more.click();
      await page.waitForFunction((n) => document.querySelectorAll("#sessions tbody tr[data-session]").length > n, before);
    }
    await page.waitForFunction(() => document.querySelector("#sessions").dataset.listed === "#/sessions?size=2");
    expect((await rows()).join() === all.join(), `paged: ${await rows()}`);
    await page.locator(`#sessions a[href='#/session/browser-demo-fork']`).click();
    await page.locator("#session-title", { hasText: "Session browser-demo-fork" }).waitFor();
  });

  await step("the agents list follows the server-wide agent events, not a poll", async () => {
    await page.goto(`${url}#/`);
    await page.locator("#agents-updated", { hasText: "live" }).waitFor();
    let lists = 0;
    const count = (request) => {
      if (request.url().endsWith("/agentloop.v1.AgentFactoryService/ListAgents")) lists += 1;
    };
    page.on("request", count);
    // An agent driven from elsewhere (the API): the page learns of it from the stream.
    const nap = {
      "@type": "type.googleapis.com/agentloop.v1.ScriptedOptions",
      steps: [{ toolCalls: [{ name: "sleep", arguments: '{"seconds": 1}' }] }, { text: "rested" }],
    };
    await api("agentloop.v1.AgentFactoryService/CreateAgent", { agentId: "browser-elsewhere", options: { tools: ["sleep"], providerOptions: nap } });
    const row = page.locator("#agents tr[data-agent='browser-elsewhere']");
    await row.waitFor(); // created: the list is read once
    const created = lists;
    await api("agentloop.v1.AgentService/SendMessage", { agentId: "browser-elsewhere", text: "rest a second" });
    await row.locator("td.status", { hasText: "running" }).waitFor();
    await row.locator("td.status", { hasText: "idle" }).waitFor();
    await page.waitForTimeout(2500); // a poll (every 2 s) would have listed the agents by now
    expect(lists === created, `the list was read ${lists - created} more times for a status change`);
    page.off("request", count);
    results.listsForCreate = created;
    await api("agentloop.v1.AgentFactoryService/DisposeAgent", { agentId: "browser-elsewhere" });
    await row.waitFor({ state: "detached" });
  });

  await step("dark mode: the system's choice, or the one picked", async () => {
    const background = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    await page.emulateMedia({ colorScheme: "light" });
    expect(await background() === "rgb(255, 255, 255)", `light: ${await background()}`);
    await page.emulateMedia({ colorScheme: "dark" });
    expect(await background() === "rgb(22, 22, 22)", `system dark: ${await background()}`);
    await page.selectOption("#theme", "light"); // picked: it wins over the system
    expect(await background() === "rgb(255, 255, 255)", `picked light: ${await background()}`);
    await page.selectOption("#theme", "dark");
    await page.emulateMedia({ colorScheme: "light" });
    await page.reload(); // kept across loads
    await page.locator("#agents-updated", { hasText: "live" }).waitFor();
    expect(await background() === "rgb(22, 22, 22)", `kept dark: ${await background()}`);
    await page.selectOption("#theme", "system");
  });

  await step("the page raised no script error", async () => {
    expect(consoleErrors.length === 0, consoleErrors.join("\n"));
  });
  console.log(`RESULTS ${JSON.stringify(results)}`);
} catch {
  failed = failed || 1;
} finally {
  await context.close();
}
process.exit(failed ? 1 : 0);
