/** Message after message to one agent, every turn read from one stream of its session. */
import type { AgentloopClient, SendOptions } from "./client.js";
import { SessionStream } from "./stream.js";
import type { Turn } from "./turn.js";

/**
 * One agent's session, followed on one stream by the turns of successive sends. The
 * stream opens with the first turn read and stays open; close it when done (a stream by
 * agent id follows the agent until it is disposed).
 */
export class Conversation {
  readonly stream: SessionStream;

  constructor(
    readonly client: AgentloopClient,
    readonly agentId: string,
  ) {
    this.stream = new SessionStream(client.agents, { agentId });
  }

  /** `client.send` to this agent; the turn reads the shared stream. */
  async send(text: string, options: Omit<SendOptions, "stream"> = {}): Promise<Turn> {
    return this.client.send(this.agentId, text, { ...options, stream: this.stream });
  }

  /** End the stream. */
  close(): void {
    this.stream.close();
  }
}
