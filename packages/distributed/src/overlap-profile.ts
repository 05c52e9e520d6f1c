/**
 * Where the in-run all-reduce's bucket nodes ran among the backward's nodes, read from an ONNX
 * Runtime profile of the accumulate session (`SessionOptions.profilePrefix`): the check that a
 * bucket's all-reduce is started while backward work remains, on the CPU (tests) or from a device
 * run's profile (tools/bench/distributed/dp-check.ts --profile).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';

/** One executed node of a profile: its op type and node name. */
export interface ProfiledNode {
  op: string;
  name: string;
}

/** The bucket nodes' places in the first run of a profile. */
export interface BucketNodeOrder {
  /** Nodes of the first run. */
  nodes: number;
  /** Backward nodes (named `grad/…`) of the first run. */
  backward: number;
  /** backwardAfter[k]: backward nodes that ran after bucket k's node (bucket 0: most of them when the all-reduce overlaps). */
  backwardAfter: number[];
}

/** The nodes of a profile file in the order they ran (every run's, one after another). */
export function profiledNodes(file: string): ProfiledNode[] {
  const events = JSON.parse(readFileSync(file, 'utf8')) as { cat?: string; name: string; args?: { op_name?: string } }[];
  return events.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time')).map((e) => ({ op: e.args?.op_name ?? '', name: e.name.replace(/_kernel_time$/, '') }));
}

/** The first run's bucket nodes (`GradAllReduce_k`) among its backward nodes, from a profile's nodes. */
export function bucketNodeOrder(nodes: readonly ProfiledNode[]): BucketNodeOrder {
  // the first run's nodes only: every run lists the same sequence
  const next = nodes.findIndex((n, i) => i > 0 && n.name === nodes[0].name);
  const run = next > 0 ? nodes.slice(0, next) : nodes;
  const backward = run.flatMap((n, i) => (n.name.startsWith('grad/') ? [i] : []));
  const backwardAfter: number[] = [];
  run.forEach((n, i) => {
    const m = /^GradAllReduce_(\d+)$/.exec(n.op);
    if (m) backwardAfter[Number(m[1])] = backward.filter((j) => j > i).length;
  });
  return { nodes: run.length, backward: backward.length, backwardAfter };
}

/**
 * The bucket order in the profiles a session wrote with `prefix` (ONNX Runtime appends
 * `_<time>.json`): that of the file whose nodes include the buckets', with its path; undefined when none does.
 */
export function bucketNodeOrderOfProfile(prefix: string): (BucketNodeOrder & { file: string }) | undefined {
  const dir = dirname(prefix);
  for (const f of readdirSync(dir).filter((x) => x.startsWith(`${basename(prefix)}_`) && x.endsWith('.json'))) {
    const nodes = profiledNodes(join(dir, f));
    if (nodes.some((n) => n.op.startsWith('GradAllReduce_'))) return { file: join(dir, f), ...bucketNodeOrder(nodes) };
  }
  return undefined;
}
