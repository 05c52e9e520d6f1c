/** Graph → ONNX ModelProto → bytes. */
import { isAnonymousDim, type Dim } from './dim';
import { onnxTypeCode } from './dtype';
import type { Graph, Node, Tensor } from './graph';
import { AttributeType, encodeModelProto, type AttributeProto, type GraphProto, type ModelProto, type NodeProto, type TensorProto, type ValueInfoProto } from './proto';
import type { AttrValue } from './op';
import { encodeValues } from './graph';

/** The ai.onnx opset Lathe emits. */
export const OPSET = 21;
/** The ONNX IR version Lathe emits (ONNX Runtime 1.29 reads it). */
export const IR_VERSION = 10;

/** Options of `toModelProto`. */
export interface SerializeOptions {
  /** Model doc string. */
  docString?: string;
  /** Key/value metadata stored in the model. */
  metadata?: Record<string, string>;
}

function dimProto(d: Dim, forOutput: boolean): { dimValue?: number; dimParam?: string } {
  if (typeof d === 'number') return { dimValue: d };
  if (isAnonymousDim(d) || (forOutput && d.includes('*'))) return {};
  return { dimParam: d };
}

function valueInfo(t: Tensor, forOutput: boolean): ValueInfoProto {
  return {
    name: t.name,
    type: { tensorType: { elemType: onnxTypeCode(t.dtype), shape: { dim: t.shape.map((d) => dimProto(d, forOutput)) } } },
  };
}

function attribute(name: string, v: AttrValue, domains: Set<string>): AttributeProto {
  switch (v.kind) {
    case 'int':
      return { name, type: AttributeType.INT, i: v.value };
    case 'float':
      return { name, type: AttributeType.FLOAT, f: v.value };
    case 'string':
      return { name, type: AttributeType.STRING, s: new TextEncoder().encode(v.value) };
    case 'ints':
      return { name, type: AttributeType.INTS, ints: v.value };
    case 'floats':
      return { name, type: AttributeType.FLOATS, floats: v.value };
    case 'tensor':
      return {
        name,
        type: AttributeType.TENSOR,
        t: { dims: v.shape, dataType: onnxTypeCode(v.dtype), rawData: encodeValues(Array.from(v.data, Number), v.dtype) },
      };
    case 'graph':
      return { name, type: AttributeType.GRAPH, g: graphProto(v.value, domains) };
  }
}

/** The Loop/If bodies a node carries. */
function bodies(n: Node): Graph[] {
  const attrs = n.op.onnxAttrs ? n.op.onnxAttrs(n.attrs as never) : {};
  return Object.values(attrs).flatMap((v) => (v.kind === 'graph' ? [v.value] : []));
}

/** Values of enclosing graphs that a body (or its own bodies) reads. */
function outerReads(body: Graph): Tensor[] {
  const reads: Tensor[] = [];
  for (const n of body.nodes) {
    for (const t of n.inputs) if (t && t.graph !== body) reads.push(t);
    for (const b of bodies(n)) for (const t of outerReads(b)) if (t.graph !== body) reads.push(t);
  }
  for (const t of body.outputs) if (t.graph !== body) reads.push(t);
  return reads;
}

/**
 * The nodes the graph's outputs (or `roots`) depend on, in order: what export keeps. Autodiff rules
 * build every input's gradient and drop the ones nothing needs (a scalar constant's, say), and ONNX
 * Runtime runs such dead nodes anyway — last, keeping whatever they read alive for the whole
 * backward pass.
 */
export function liveNodes(graph: Graph, roots: readonly Tensor[] = graph.outputs): Node[] {
  const needed = new Set<Tensor>(roots);
  const live: Node[] = [];
  for (let k = graph.nodes.length - 1; k >= 0; k--) {
    const n = graph.nodes[k];
    if (!n.outputs.some((o) => needed.has(o))) continue;
    live.push(n);
    for (const t of n.inputs) if (t) needed.add(t);
    for (const b of bodies(n)) for (const t of outerReads(b)) needed.add(t);
  }
  return live.reverse();
}

function graphProto(graph: Graph, domains: Set<string>): GraphProto {
  const nodes = liveNodes(graph);
  // Initializers only dead nodes read go too (ORT would warn about each).
  const read = new Set<Tensor>(graph.outputs);
  for (const n of nodes) {
    for (const t of n.inputs) if (t) read.add(t);
    for (const b of bodies(n)) for (const t of outerReads(b)) read.add(t);
  }
  const node: NodeProto[] = nodes.map((n) => {
    const inputs = n.inputs.map((t) => (t ? t.name : ''));
    while (inputs.length && inputs[inputs.length - 1] === '') inputs.pop();
    const domain = n.op.domain ?? '';
    if (domain) domains.add(domain);
    const attrs = n.op.onnxAttrs ? n.op.onnxAttrs(n.attrs as never) : {};
    return {
      input: inputs,
      output: n.outputs.map((t) => t.name),
      name: n.name,
      opType: n.op.onnxOp ?? n.op.name,
      domain,
      attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v, domains)),
    };
  });
  const initializer: TensorProto[] = [...graph.initializers.values()].filter(({ tensor }) => read.has(tensor) || graph.inputs.includes(tensor)).map(({ tensor, data }) => {
    const base = { name: tensor.name, dims: tensor.shape as number[], dataType: onnxTypeCode(tensor.dtype) };
    if (data.kind === 'inline') return { ...base, rawData: data.bytes };
    return {
      ...base,
      dataLocation: 1,
      externalData: [
        { key: 'location', value: data.location },
        { key: 'offset', value: String(data.offset) },
        { key: 'length', value: String(data.length) },
      ],
    };
  });
  // Every intermediate's type and shape as Lathe inferred them: ONNX Runtime's own symbolic shape
  // inference is slow on large graphs (superlinear in node count) and starts from these instead.
  const outputs = new Set(graph.outputs);
  const intermediates = nodes.flatMap((n) => n.outputs.filter((t) => !outputs.has(t)).map((t) => valueInfo(t, false)));
  return {
    name: graph.name,
    node,
    initializer,
    valueInfo: intermediates,
    input: graph.inputs.map((t) => valueInfo(t, false)),
    output: graph.outputs.map((t) => valueInfo(t, true)),
  };
}

/** The ONNX model of a root graph. */
export function toModelProto(graph: Graph, opts: SerializeOptions = {}): ModelProto {
  if (graph.parent) throw new Error('toModelProto: serialize the root graph, not a Loop/If body');
  if (graph.outputs.length === 0) throw new Error(`graph '${graph.name}' has no outputs; mark some with graph.output()`);
  const domains = new Set<string>();
  const g = graphProto(graph, domains);
  return {
    irVersion: IR_VERSION,
    producerName: 'lathe',
    producerVersion: '0.1.0',
    docString: opts.docString,
    graph: g,
    opsetImport: [{ domain: '', version: OPSET }, ...[...domains].map((domain) => ({ domain, version: 1 }))],
    metadataProps: Object.entries(opts.metadata ?? {}).map(([key, value]) => ({ key, value })),
  };
}

/** The ONNX model of a root graph, encoded. */
export function toModelBytes(graph: Graph, opts: SerializeOptions = {}): Uint8Array {
  return encodeModelProto(toModelProto(graph, opts));
}
