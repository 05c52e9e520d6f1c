/**
 * `LocalGroup`: N ranks in one process, for tests of the data-parallel logic on the CPU (CI has
 * no GPU and no NCCL). Each rank is a `Collectives` of its own; a round completes when all N ranks
 * have entered it, so the ranks' steps run interleaved under `Promise.all`.
 */
import { DistributedError, HostCollectives, type RoundResult } from './collectives';

interface Pending {
  parts: (Uint8Array | undefined)[];
  resolvers: ((b: Uint8Array) => void)[];
  rejecters: ((e: Error) => void)[];
  combine?: (parts: Uint8Array[]) => RoundResult;
}

/** The shared state of one in-process group. */
class Hub {
  private readonly rounds = new Map<number, Pending>();
  private readonly next: number[];
  failure: Error | undefined;

  constructor(readonly worldSize: number) {
    this.next = new Array(worldSize).fill(0);
  }

  enter(rank: number, payload: Uint8Array, combine: (parts: Uint8Array[]) => RoundResult): Promise<Uint8Array> {
    if (this.failure) return Promise.reject(this.failure);
    const seq = this.next[rank]++;
    let p = this.rounds.get(seq);
    if (!p) {
      p = { parts: new Array(this.worldSize).fill(undefined), resolvers: [], rejecters: [] };
      this.rounds.set(seq, p);
    }
    const round = p;
    round.parts[rank] = payload;
    // rank 0's combine is the one run, as on the TCP star (where rank 0 computes)
    if (rank === 0) round.combine = combine;
    const done = new Promise<Uint8Array>((resolve, reject) => {
      round.resolvers[rank] = resolve;
      round.rejecters[rank] = reject;
    });
    if (round.parts.every((x) => x !== undefined)) {
      this.rounds.delete(seq);
      try {
        const out = round.combine!(round.parts as Uint8Array[]);
        round.resolvers.forEach((r, i) => r(out instanceof Uint8Array ? out : out[i]));
      } catch (e) {
        round.rejecters.forEach((r) => r(e as Error));
      }
    }
    return done;
  }

  fail(e: Error): void {
    if (this.failure) return;
    this.failure = e;
    for (const p of this.rounds.values()) p.rejecters.forEach((r) => r?.(e));
    this.rounds.clear();
  }
}

/** One rank of a `LocalGroup`. */
class LocalRank extends HostCollectives {
  readonly backend = 'local';
  constructor(
    private readonly hub: Hub,
    readonly rank: number,
  ) {
    super();
  }

  get worldSize(): number {
    return this.hub.worldSize;
  }

  protected round(payload: Uint8Array, combine: (parts: Uint8Array[]) => RoundResult): Promise<Uint8Array> {
    return this.hub.enter(this.rank, payload, combine);
  }

  abort(reason: string): void {
    this.hub.fail(new DistributedError(`rank ${this.rank} aborted: ${reason}`, this.rank));
  }

  async close(): Promise<void> {}
}

/** N in-process ranks that form one group. */
export const LocalGroup = {
  /** The `worldSize` ranks of a new group, rank order. */
  create(worldSize: number): HostCollectives[] {
    if (!Number.isInteger(worldSize) || worldSize < 1) throw new Error(`LocalGroup: worldSize must be a positive integer, got ${worldSize}`);
    const hub = new Hub(worldSize);
    return Array.from({ length: worldSize }, (_, r) => new LocalRank(hub, r));
  },
};
