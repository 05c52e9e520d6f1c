/**
 * `TcpCollectives`: ranks in separate processes (CPU training, CI, and the rendezvous of the NCCL
 * backend). Rank 0 listens at MASTER_ADDR:MASTER_PORT and every other rank connects to it: a star.
 * In each round every rank sends its payload to rank 0, which combines them and sends each rank
 * its result. Small and simple rather than fast: gradients of CPU-sized models, config digests,
 * rewards, NCCL's unique id.
 *
 * A peer that disconnects without saying goodbye (its process died) fails every rank's pending and
 * later operations with a message naming it: rank 0 tells the others, and when rank 0 itself dies
 * the others see its connection close.
 */
import * as net from 'node:net';
import { checkRank, DistributedError, HostCollectives, type RoundResult } from './collectives';

const enum Frame {
  Hello = 1,
  Welcome = 2,
  Data = 3,
  Result = 4,
  Abort = 5,
  Bye = 6,
}

/** Options of `TcpCollectives.connect`. */
export interface TcpOptions {
  rank: number;
  worldSize: number;
  /** Host of rank 0 (where it listens; other ranks connect to it). */
  addr: string;
  port: number;
  /** How long the group may take to form: rank 0 waits for every rank, the others retry connecting (default 120 s). */
  timeoutMs?: number;
}

/** Reads length-prefixed frames from a socket. */
class FrameReader {
  private chunks: Buffer[] = [];
  private size = 0;
  constructor(private readonly onFrame: (type: Frame, payload: Uint8Array) => void) {}

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.size >= 9) {
      const head = this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks);
      this.chunks = [head];
      const type = head.readUInt8(0) as Frame;
      const n = head.readUInt32LE(1) + head.readUInt32LE(5) * 2 ** 32;
      if (this.size < 9 + n) return;
      const payload = new Uint8Array(head.subarray(9, 9 + n));
      const rest = head.subarray(9 + n);
      this.chunks = rest.length ? [rest] : [];
      this.size = rest.length;
      this.onFrame(type, payload);
    }
  }
}

/** Writes a frame; the promise settles once the kernel has it (or the socket failed). */
function send(socket: net.Socket, type: Frame, payload: Uint8Array = new Uint8Array(0)): Promise<void> {
  const head = Buffer.alloc(9);
  head.writeUInt8(type, 0);
  head.writeUInt32LE(payload.byteLength % 2 ** 32, 1);
  head.writeUInt32LE(Math.floor(payload.byteLength / 2 ** 32), 5);
  return new Promise((resolve) => {
    socket.write(head);
    if (payload.byteLength) socket.write(payload, () => resolve());
    else socket.write(new Uint8Array(0), () => resolve());
  });
}

const text = (s: string) => new TextEncoder().encode(s);
const untext = (b: Uint8Array) => new TextDecoder().decode(b);

/** A FIFO of payloads and of those waiting for them. */
class Inbox {
  private items: Uint8Array[] = [];
  private waiters: { resolve: (b: Uint8Array) => void; reject: (e: Error) => void }[] = [];
  put(b: Uint8Array): void {
    const w = this.waiters.shift();
    if (w) w.resolve(b);
    else this.items.push(b);
  }
  take(failure: Error | undefined): Promise<Uint8Array> {
    if (this.items.length) return Promise.resolve(this.items.shift()!);
    if (failure ?? this.closed) return Promise.reject(failure ?? this.closed);
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }
  fail(e: Error): void {
    for (const w of this.waiters.splice(0)) w.reject(e);
  }
  /** No more payloads will come: waiting takes fail with `e`, and so do later ones once the queue is empty. */
  close(e: Error): void {
    this.closed = e;
    this.fail(e);
  }
  closed: Error | undefined;
}

/** Collectives between processes over TCP (rank 0 hosts). */
export class TcpCollectives extends HostCollectives {
  readonly backend = 'tcp';
  /** What ended the group (a peer's death or abort), once something has. */
  failure: DistributedError | undefined;
  private closing = false;
  private chain: Promise<unknown> = Promise.resolve();
  /** rank 0: one connection and inbox per other rank; others: [the connection to rank 0]. */
  private readonly inboxes = new Map<number, Inbox>();
  private readonly byes = new Set<number>();
  private onBye: (() => void) | undefined;

  private constructor(
    readonly rank: number,
    readonly worldSize: number,
    private readonly where: string,
    private readonly sockets: Map<number, net.Socket>,
    private readonly server?: net.Server,
  ) {
    super();
  }

  /** Forms the group: rank 0 listens and waits for every rank; the others connect. */
  static async connect(opts: TcpOptions): Promise<TcpCollectives> {
    checkRank('rank', opts.rank, opts.worldSize);
    const timeoutMs = opts.timeoutMs ?? 120_000;
    const where = `${opts.addr}:${opts.port}`;
    return opts.rank === 0 ? TcpCollectives.host(opts, where, timeoutMs) : TcpCollectives.join(opts, where, timeoutMs);
  }

  private static host(opts: TcpOptions, where: string, timeoutMs: number): Promise<TcpCollectives> {
    return new Promise((resolve, reject) => {
      const sockets = new Map<number, net.Socket>();
      const early = new Map<number, Uint8Array[]>();
      let group: TcpCollectives | undefined;
      const server = net.createServer((socket) => {
        socket.setNoDelay(true);
        let peer: number | undefined;
        const reader = new FrameReader((type, payload) => {
          if (peer === undefined) {
            if (type !== Frame.Hello) return socket.destroy();
            const hello = JSON.parse(untext(payload)) as { rank: number; worldSize: number };
            if (hello.worldSize !== opts.worldSize || !Number.isInteger(hello.rank) || hello.rank < 1 || hello.rank >= opts.worldSize || sockets.has(hello.rank)) {
              const why = hello.worldSize !== opts.worldSize ? `its WORLD_SIZE is ${hello.worldSize}, rank 0's is ${opts.worldSize}` : sockets.has(hello.rank) ? `rank ${hello.rank} is already connected` : `rank ${hello.rank} is not a rank of a world of ${opts.worldSize}`;
              void send(socket, Frame.Abort, text(`the rendezvous at ${where} refused a process: ${why}`));
              socket.end();
              return;
            }
            peer = hello.rank;
            sockets.set(peer, socket);
            if (sockets.size === opts.worldSize - 1) {
              clearTimeout(timer);
              group = new TcpCollectives(0, opts.worldSize, where, sockets, server);
              for (const [r, s] of sockets) {
                group.watch(r, s);
                for (const b of early.get(r) ?? []) group.inbox(r).put(b);
                void send(s, Frame.Welcome);
              }
              resolve(group);
            }
            return;
          }
          if (group) group.receive(peer, type, payload);
          else if (type === Frame.Data) early.set(peer, [...(early.get(peer) ?? []), payload]);
        });
        socket.on('data', (c) => reader.push(c));
        socket.on('error', () => undefined);
        socket.on('close', () => {
          if (!group && peer !== undefined) {
            sockets.delete(peer);
          }
        });
      });
      const timer = setTimeout(() => {
        const missing = Array.from({ length: opts.worldSize - 1 }, (_, i) => i + 1).filter((r) => !sockets.has(r));
        server.close();
        for (const s of sockets.values()) s.destroy();
        reject(new DistributedError(`rendezvous at ${where}: ranks ${missing.join(', ')} did not connect within ${timeoutMs / 1000} s`, missing[0]));
      }, timeoutMs);
      server.on('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        reject(new DistributedError(e.code === 'EADDRINUSE' ? `rendezvous: port ${opts.port} is in use (another job on this host?): pick another with --master_port or MASTER_PORT` : `rendezvous at ${where}: ${e.message}`));
      });
      if (opts.worldSize === 1) {
        clearTimeout(timer);
        resolve(new TcpCollectives(0, 1, where, sockets));
        return;
      }
      server.listen(opts.port);
    });
  }

  private static async join(opts: TcpOptions, where: string, timeoutMs: number): Promise<TcpCollectives> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const socket = await new Promise<net.Socket | Error>((resolve) => {
        const s = net.connect({ host: opts.addr, port: opts.port });
        s.once('connect', () => resolve(s));
        s.once('error', (e) => resolve(e));
      });
      if (socket instanceof net.Socket) {
        socket.setNoDelay(true);
        return new Promise((resolve, reject) => {
          const sockets = new Map([[0, socket]]);
          const group = new TcpCollectives(opts.rank, opts.worldSize, where, sockets);
          let welcomed = false;
          const timer = setTimeout(() => {
            socket.destroy();
            reject(new DistributedError(`rendezvous at ${where}: rank 0 did not start the group within ${timeoutMs / 1000} s (are all ${opts.worldSize} ranks running?)`, 0));
          }, Math.max(1, deadline - Date.now()));
          const reader = new FrameReader((type, payload) => {
            if (!welcomed) {
              clearTimeout(timer);
              if (type === Frame.Welcome) {
                welcomed = true;
                group.watch(0, socket, reader);
                resolve(group);
              } else reject(new DistributedError(type === Frame.Abort ? untext(payload) : `rendezvous at ${where}: unexpected reply`, 0));
              return;
            }
            group.receive(0, type, payload);
          });
          socket.on('data', (c) => reader.push(c));
          socket.on('error', () => undefined);
          socket.once('close', () => {
            if (!welcomed) {
              clearTimeout(timer);
              reject(new DistributedError(`rendezvous at ${where}: rank 0 closed the connection before the group formed`, 0));
            }
          });
          void send(socket, Frame.Hello, text(JSON.stringify({ rank: opts.rank, worldSize: opts.worldSize })));
        });
      }
      if (Date.now() > deadline) throw new DistributedError(`rendezvous at ${where}: cannot reach rank 0 within ${timeoutMs / 1000} s (${socket.message}); is MASTER_ADDR right and rank 0 running?`, 0);
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  private inbox(r: number): Inbox {
    let box = this.inboxes.get(r);
    if (!box) this.inboxes.set(r, (box = new Inbox()));
    return box;
  }

  /** Watches a peer's connection for its death. */
  private watch(peer: number, socket: net.Socket, _reader?: FrameReader): void {
    socket.on('close', () => {
      if (this.closing || this.byes.has(peer)) return;
      const who = peer === 0 ? `rank 0 (the rendezvous host at ${this.where})` : `rank ${peer}`;
      this.fail(new DistributedError(`${who} disconnected: its process exited or crashed`, peer));
    });
  }

  private receive(peer: number, type: Frame, payload: Uint8Array): void {
    if (type === Frame.Data || type === Frame.Result) this.inbox(peer).put(payload);
    else if (type === Frame.Abort) this.fail(new DistributedError(untext(payload), peer));
    else if (type === Frame.Bye) {
      this.byes.add(peer);
      // a rank that left cannot take part in another round: one still waiting for it fails, named
      this.inbox(peer).close(new DistributedError(`rank ${peer} left the group while the others still expected it in a collective (it finished early or stopped)`, peer));
      this.onBye?.();
    }
  }

  /** Fails pending and later operations; rank 0 passes the reason on to the other ranks. */
  private fail(e: DistributedError): void {
    if (this.failure) return;
    this.failure = e;
    for (const box of this.inboxes.values()) box.fail(e);
    if (this.rank === 0) {
      for (const [r, s] of this.sockets) {
        if (r === e.peer || s.destroyed) continue;
        void send(s, Frame.Abort, text(e.message));
        s.end();
      }
    }
  }

  protected round(payload: Uint8Array, combine: (parts: Uint8Array[]) => RoundResult): Promise<Uint8Array> {
    const run = async (): Promise<Uint8Array> => {
      if (this.failure) throw this.failure;
      if (this.worldSize === 1) {
        const out = combine([payload]);
        return out instanceof Uint8Array ? out : out[0];
      }
      if (this.rank !== 0) {
        void send(this.sockets.get(0)!, Frame.Data, payload);
        return this.inbox(0).take(this.failure);
      }
      const parts = [payload];
      for (let r = 1; r < this.worldSize; r++) parts.push(await this.inbox(r).take(this.failure));
      const out = combine(parts);
      // flushed before returning: rank 0 may block next (NCCL's communicator init waits for every rank, and needs them to have its id)
      await Promise.all(Array.from({ length: this.worldSize - 1 }, (_, i) => send(this.sockets.get(i + 1)!, Frame.Result, out instanceof Uint8Array ? out : out[i + 1])));
      return out instanceof Uint8Array ? out : out[0];
    };
    const p = this.chain.then(run, run);
    this.chain = p.catch(() => undefined);
    return p;
  }

  abort(reason: string): void {
    const e = new DistributedError(`rank ${this.rank} aborted: ${reason}`, this.rank);
    if (this.rank !== 0 && !this.failure) {
      const s = this.sockets.get(0);
      if (s && !s.destroyed) void send(s, Frame.Abort, text(e.message));
    }
    this.fail(e);
    if (this.rank !== 0) this.closing = true;
  }

  async close(): Promise<void> {
    if (this.closing) return;
    if (this.rank !== 0) {
      this.closing = true;
      const s = this.sockets.get(0)!;
      if (!s.destroyed) {
        void send(s, Frame.Bye);
        s.end();
      }
      return;
    }
    // rank 0 waits (briefly) for every rank's goodbye, so none sees its connection drop first
    if (!this.failure && this.worldSize > 1) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, 10_000);
        this.onBye = () => {
          if (this.byes.size === this.worldSize - 1) {
            clearTimeout(t);
            resolve();
          }
        };
        this.onBye();
      });
    }
    this.closing = true;
    for (const s of this.sockets.values()) s.destroy();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
