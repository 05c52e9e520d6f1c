/**
 * Splitting a graph around kernel regions. A region is the nodes built inside `kernelRegion(g,
 * kernel, fn)`: the composed ops a Lathe kernel replaces on CUDA (the CPU runs them as they are).
 * `splitGraph` orders the graph's live nodes into steps — ORT segments (each compiled as a graph of
 * its own and run bound) and kernel launches — so that every step's inputs exist when it starts,
 * with as few segments as the dependencies allow. Each step names its boundary tensors: what it
 * reads from earlier steps or the graph's inputs, and what later steps or the graph's outputs read.
 */
import * as L from '@lathe/onnx';
import { Graph, type Node, type Tensor } from '@lathe/onnx';
import { DeviceTensor, type Binding, type Device, type HostTensor, type Session, type SessionOptions } from '@lathe/runtime';

/** The scope-name prefix that marks a kernel region. */
export const KERNEL_SCOPE = 'kernel:';

/** Builds `fn`'s nodes as a region that kernel `kernel` replaces when the graph is split. */
export function kernelRegion<T>(g: Graph, kernel: string, fn: () => T): T {
  if (!/^[A-Za-z0-9_.-]+$/.test(kernel)) throw new Error(`kernelRegion: kernel name '${kernel}' must be letters, digits, '_', '.' or '-'`);
  return g.scope(`${KERNEL_SCOPE}${kernel}`, fn);
}

/** The region a node belongs to: its key (scope path up to the marker, unique per use) and kernel name. */
export function regionOf(node: Node): { key: string; kernel: string } | undefined {
  const parts = node.name.split('/');
  const i = parts.findIndex((p) => p.startsWith(KERNEL_SCOPE));
  if (i < 0) return undefined;
  return { key: parts.slice(0, i + 1).join('/'), kernel: parts[i].slice(KERNEL_SCOPE.length) };
}

/** One step of a split graph. */
export type SplitStep =
  | { kind: 'ort'; nodes: Node[]; inputs: Tensor[]; outputs: Tensor[] }
  | { kind: 'kernel'; kernel: string; region: string; nodes: Node[]; inputs: Tensor[]; outputs: Tensor[] };

/**
 * The steps of `g` in run order. Constants (initializers and nodes computed from constants only)
 * are never boundaries: each segment that reads one gets its own copy. Throws, naming the region,
 * when a region's nodes depend on each other through nodes outside it (no order runs it as one
 * launch).
 */
export function splitGraph(g: Graph): SplitStep[] {
  const live = liveNodes(g);
  const isConst = constantTest(g);
  const nodes = g.nodes.filter((n) => live.has(n) && !n.outputs.every(isConst));
  const deps = new Map<Node, Node[]>(nodes.map((n) => [n, n.inputs.filter((t): t is Tensor => !!t && !isConst(t) && !!t.node).map((t) => t.node!)]));
  const regions = new Map<string, { kernel: string; nodes: Node[] }>();
  for (const n of nodes) {
    const r = regionOf(n);
    if (!r) continue;
    if (!regions.has(r.key)) regions.set(r.key, { kernel: r.kernel, nodes: [] });
    regions.get(r.key)!.nodes.push(n);
  }
  const done = new Set<Node>();
  const ready = (n: Node, within: Set<Node>) => deps.get(n)!.every((d) => done.has(d) || within.has(d));
  const steps: { kind: 'ort' | 'kernel'; region?: string; kernel?: string; nodes: Node[] }[] = [];
  while (done.size < nodes.length) {
    const seg = new Set<Node>();
    for (const n of nodes) if (!done.has(n) && !regionOf(n) && ready(n, seg)) seg.add(n);
    if (seg.size) steps.push({ kind: 'ort', nodes: [...seg] });
    for (const n of seg) done.add(n);
    let progressed = seg.size > 0;
    for (const [key, r] of regions) {
      if (done.has(r.nodes[0])) continue;
      const members = new Set(r.nodes);
      if (!r.nodes.every((n) => ready(n, members))) continue;
      steps.push({ kind: 'kernel', region: key, kernel: r.kernel, nodes: r.nodes });
      for (const n of r.nodes) done.add(n);
      progressed = true;
    }
    if (!progressed) {
      const stuck = [...regions.keys()].filter((k) => !done.has(regions.get(k)!.nodes[0]));
      throw new Error(`splitGraph: region(s) ${stuck.map((k) => `'${k}'`).join(', ')} of graph '${g.name}' read a value computed outside the region from another of their own values; build each region from values computed before it`);
    }
  }
  const stepOf = new Map<Node, number>();
  steps.forEach((s, i) => s.nodes.forEach((n) => stepOf.set(n, i)));
  const readers = new Map<Tensor, Set<number>>();
  steps.forEach((s, i) =>
    s.nodes.forEach((n) =>
      n.inputs.forEach((t) => {
        if (t && !isConst(t)) (readers.get(t) ?? readers.set(t, new Set()).get(t)!).add(i);
      }),
    ),
  );
  return steps.map((s, i) => {
    const produced = new Set(s.nodes.flatMap((n) => n.outputs));
    const inputs = unique(s.nodes.flatMap((n) => n.inputs.filter((t): t is Tensor => !!t && !isConst(t) && !produced.has(t))));
    const outputs = s.nodes.flatMap((n) => n.outputs).filter((t) => g.outputs.includes(t) || [...(readers.get(t) ?? [])].some((j) => j !== i));
    return s.kind === 'ort' ? { kind: 'ort', nodes: s.nodes, inputs, outputs } : { kind: 'kernel', kernel: s.kernel!, region: s.region!, nodes: s.nodes, inputs, outputs };
  });
}

/**
 * An ORT step as a graph of its own: its boundary inputs as graph inputs and its boundary outputs
 * as graph outputs, each under the original tensor's name (so steps chain by name), with the
 * constants it reads copied in.
 */
export function segmentGraph(g: Graph, step: SplitStep, name = `${g.name}_segment`): Graph {
  const sg = new Graph(name);
  const map = new Map<Tensor, Tensor>();
  for (const t of step.inputs) map.set(t, sg.input(t.name, t.dtype, t.shape));
  const copy = (t: Tensor): Tensor => {
    const known = map.get(t);
    if (known) return known;
    if (!t.node) {
      const init = g.initializers.get(t.name);
      if (!init) throw new Error(`segmentGraph: '${t.name}' is neither a boundary input nor an initializer of '${g.name}'`);
      const c = sg.initializer(t.name, t.dtype, t.shape.map(Number), init.data);
      map.set(t, c);
      return c;
    }
    replay(t.node);
    return map.get(t)!;
  };
  const replay = (n: Node) => {
    if (Object.values(n.attrs).some((v) => v instanceof Graph)) throw new Error(`segmentGraph: node '${n.name}' (${n.op.name}) has a subgraph; a segment cannot hold Loop/If nodes yet`);
    const outs = L.applyOp(n.op, n.inputs.map((t) => (t ? copy(t) : null)), n.attrs, sg);
    n.outputs.forEach((t, k) => map.set(t, outs[k]));
  };
  for (const n of step.nodes) replay(n);
  for (const t of step.outputs) sg.output(map.get(t)!, t.name);
  return sg;
}

/** Nodes the graph's outputs depend on (ONNX Runtime would run the others too; the split drops them). */
function liveNodes(g: Graph): Set<Node> {
  const live = new Set<Node>();
  const stack = g.outputs.map((t) => t.node).filter((n): n is Node => !!n);
  while (stack.length) {
    const n = stack.pop()!;
    if (live.has(n)) continue;
    live.add(n);
    for (const t of n.inputs) if (t?.node && t.graph === g) stack.push(t.node);
  }
  return live;
}

/** Whether a tensor is a constant: an initializer, or computed from initializers only. */
function constantTest(g: Graph): (t: Tensor) => boolean {
  const memo = new Map<Tensor, boolean>();
  const test = (t: Tensor): boolean => {
    let v = memo.get(t);
    if (v === undefined) {
      v = t.node ? t.node.inputs.length > 0 && t.node.inputs.every((i) => !i || test(i)) : g.initializers.has(t.name) && !g.inputs.includes(t);
      memo.set(t, v);
    }
    return v;
  };
  return test;
}

function unique<T>(xs: T[]): T[] {
  return [...new Set(xs)];
}

/** A kernel region's implementation: reads the step's inputs, returns its outputs (in `step.outputs` order, owned by the caller). */
export type KernelImpl = (inputs: DeviceTensor[], step: Extract<SplitStep, { kind: 'kernel' }>) => DeviceTensor[];

/**
 * A split graph ready to run: each ORT segment compiled as a session with a binding of its own,
 * each kernel region an implementation from `impls`. A run goes through the steps in order, every
 * segment a bound run that does not wait for the device (`synchronize: false`; on CUDA the kernels
 * launch on the same stream), and hands back the graph's outputs as device tensors.
 */
export class SplitProgram {
  private readonly sessions: Session[] = [];
  private readonly bindings = new Map<SplitStep, Binding>();
  /** Tensors the kernels made in the last run (freed by the next run or `dispose`). */
  private made: DeviceTensor[] = [];

  private constructor(
    readonly graph: Graph,
    readonly steps: SplitStep[],
    private readonly impls: Record<string, KernelImpl>,
  ) {}

  /** Splits `graph` and compiles its segments for `device`; every region's kernel must be in `impls`. */
  static compile(device: Device, graph: Graph, impls: Record<string, KernelImpl>, opts: SessionOptions = {}): SplitProgram {
    const steps = splitGraph(graph);
    const missing = [...new Set(steps.flatMap((s) => (s.kind === 'kernel' && !impls[s.kernel] ? [s.kernel] : [])))];
    if (missing.length) throw new Error(`SplitProgram: graph '${graph.name}' has region(s) of kernel(s) ${missing.join(', ')} without an implementation (given: ${Object.keys(impls).join(', ') || 'none'})`);
    const p = new SplitProgram(graph, steps, impls);
    steps.forEach((s, i) => {
      if (s.kind !== 'ort') return;
      const session = device.compile(segmentGraph(graph, s, `${graph.name}_segment${i}`), { ...opts, name: `${opts.name ?? graph.name}/segment${i}` });
      p.sessions.push(session);
      const b = session.binding();
      for (const t of s.outputs) b.output(t.name, 'device');
      p.bindings.set(s, b);
    });
    return p;
  }

  /** Runs every step; returns the graph's outputs by name (valid until the next run; copy what must outlive it). */
  run(feeds: Record<string, DeviceTensor | HostTensor>): Record<string, DeviceTensor> {
    for (const t of this.made.splice(0)) t.dispose();
    const values = new Map<string, DeviceTensor | HostTensor>(Object.entries(feeds));
    const value = (t: Tensor) => {
      const v = values.get(t.name);
      if (!v) throw new Error(`SplitProgram '${this.graph.name}': no value for '${t.name}' (missing feed?)`);
      return v;
    };
    for (const s of this.steps) {
      if (s.kind === 'kernel') {
        const inputs = s.inputs.map((t) => {
          const v = value(t);
          if (!(v instanceof DeviceTensor)) throw new Error(`SplitProgram '${this.graph.name}': kernel '${s.kernel}' reads '${t.name}', which must be fed as a device tensor`);
          return v;
        });
        const outs = this.impls[s.kernel](inputs, s);
        if (outs.length !== s.outputs.length) throw new Error(`SplitProgram '${this.graph.name}': kernel '${s.kernel}' returned ${outs.length} tensors for ${s.outputs.length} outputs (${s.outputs.map((t) => t.name).join(', ')})`);
        this.made.push(...outs);
        s.outputs.forEach((t, k) => values.set(t.name, outs[k]));
        continue;
      }
      const b = this.bindings.get(s)!;
      for (const t of s.inputs) b.input(t.name, value(t));
      b.runSync({ synchronize: false });
      for (const t of s.outputs) values.set(t.name, b.get(t.name));
    }
    return Object.fromEntries(this.graph.outputs.map((t) => [t.name, value(t) as DeviceTensor]));
  }

  /** Frees the sessions, their bindings and the kernels' last outputs. */
  dispose(): void {
    for (const t of this.made.splice(0)) t.dispose();
    for (const s of this.sessions.splice(0)) s.dispose();
  }
}
