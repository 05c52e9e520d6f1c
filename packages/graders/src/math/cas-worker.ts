/** Entry point of the CAS worker thread: answers {@link CasRequest} messages with verdicts. */
import { parentPort } from 'node:worker_threads';
import { SymbolicChecker, type CasRequest, type CasVerdict } from './cas';

/** A request as posted to the worker. */
export interface CasWorkerRequest {
  id: number;
  request: CasRequest;
}

/** The worker's reply: a verdict, or the error the CAS threw; id 0 announces that the worker is ready. */
export interface CasWorkerReply {
  id: number;
  verdict?: CasVerdict;
  error?: string;
}

if (parentPort) {
  const port = parentPort;
  const checker = new SymbolicChecker();
  port.on('message', (msg: CasWorkerRequest) => {
    let reply: CasWorkerReply;
    try {
      reply = { id: msg.id, verdict: checker.check(msg.request) };
    } catch (e) {
      reply = { id: msg.id, error: (e as Error).message };
    }
    port.postMessage(reply);
  });
  checker.check({ kind: 'expr', gold: '\\frac{x}{2}', pred: '0.5x', relTol: 1e-9 });
  const ready: CasWorkerReply = { id: 0 };
  port.postMessage(ready);
}
