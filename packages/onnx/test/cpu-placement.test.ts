/**
 * cpuPlacedNodes against ONNX Runtime's GetCpuPreferredNodes rule, on hand-written models whose
 * placement follows from the rule by hand: seeds at Shape/Size outputs, inputs that are CPU tensors,
 * graph inputs or small initializers, the float16/bfloat16 veto, inputs the CUDA kernel reads from
 * CPU memory, nodes without a CUDA kernel, the modelled level-1 rewrites (constant folding, static
 * Shape folding, Shape of a Transpose) and the aggressive mode.
 */
import { cpuPlacedNodes, OnnxDataType, type GraphProto, type ModelProto, type NodeProto, type TensorProto, type ValueInfoProto } from '@lathe/onnx';

type Dims = (number | string)[];
const F: number = OnnxDataType.FLOAT;
const I64: number = OnnxDataType.INT64;
const BF16: number = OnnxDataType.BFLOAT16;

const value = (name: string, elemType: number, dims: Dims): ValueInfoProto => ({
  name,
  type: { tensorType: { elemType, shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) } } },
});
const node = (name: string, opType: string, input: string[], output: string[], attrs: Record<string, number> = {}): NodeProto => ({
  name,
  opType,
  input,
  output,
  attribute: Object.entries(attrs).map(([k, i]) => ({ name: k, type: 2, i })),
});
const init = (name: string, dims: number[], dataType = I64): TensorProto => ({ name, dims, dataType, rawData: new Uint8Array(8 * dims.reduce((a, b) => a * b, 1)) });

/** A model from its nodes, graph inputs, initializers and every value's type. */
function model(nodes: NodeProto[], inputs: ValueInfoProto[], initializers: TensorProto[], values: ValueInfoProto[], outputs: string[]): ModelProto {
  const graph: GraphProto = {
    name: 'g',
    node: nodes,
    input: inputs,
    initializer: initializers,
    valueInfo: values.filter((v) => !outputs.includes(v.name)),
    output: values.filter((v) => outputs.includes(v.name)),
  };
  return { irVersion: 10, graph, opsetImport: [{ domain: '', version: 21 }] };
}

const placed = (m: ModelProto, aggressive = false) => cpuPlacedNodes(m, { aggressive }).map((n) => `${n.name}:${n.reason}`);

describe('cpuPlacedNodes', () => {
  // x [B, T, 8] float32 is a graph input; its run-time shape feeds a computed Reshape target
  const x = value('x', F, ['B', 'T', 8]);

  test('shape arithmetic on a Shape output goes to the CPU; the Shape and the Reshape reading the result stay', () => {
    // s = Shape(x); bt = Gather(s, [0,1]); tgt = Concat(bt, [-1]); y = Reshape(x, tgt)
    const m = model(
      [node('shape', 'Shape', ['x'], ['s']), node('gather', 'Gather', ['s', 'idx'], ['bt']), node('concat', 'Concat', ['bt', 'minus1'], ['tgt'], { axis: 0 }), node('reshape', 'Reshape', ['x', 'tgt'], ['y'])],
      [x],
      [init('idx', [2]), init('minus1', [1])],
      [value('s', I64, [3]), value('bt', I64, [2]), value('tgt', I64, [3]), value('y', F, ['B', 'T', 8])],
      ['y'],
    );
    expect(placed(m)).toEqual(['gather:shape computation', 'concat:shape computation']);
  });

  test('a Shape output read directly where the CUDA kernel wants it on the CPU (Expand, Reshape, Slice, ConstantOfShape) places nothing', () => {
    const m = model(
      [
        node('shape', 'Shape', ['x'], ['s']),
        node('expand', 'Expand', ['one', 's'], ['e']),
        node('reshape', 'Reshape', ['x', 's'], ['r']),
        node('slice', 'Slice', ['x', 's', 's'], ['sl']),
        node('zeros', 'ConstantOfShape', ['s'], ['z']),
      ],
      [x],
      [init('one', [1], F)],
      [value('s', I64, [3]), value('e', F, ['B', 'T', 8]), value('r', F, ['B', 'T', 8]), value('sl', F, ['?', '?', '?']), value('z', F, ['B', 'T', 8])],
      ['e', 'r', 'sl', 'z'],
    );
    expect(placed(m)).toEqual([]);
  });

  test('graph inputs of any size count as CPU-ready, large initializers and device tensors do not, and half-precision inputs veto', () => {
    // n = Cast(Shape(x)[0]) as float32 [1]: CPU. Then
    //   a = Add(n, x)        x is a graph input (1000s of elements): CPU
    //   b = Add(n, big)      big is a 101-element initializer: stays
    //   c = Add(n, small)    small is a 100-element initializer: CPU
    //   d = Add(n, relu)     relu = Relu(x) is a device tensor: stays
    //   h = Cast(n) → bf16   its input is float32: CPU; k = Mul(h, hsmall) has bfloat16 inputs: stays
    const m = model(
      [
        node('shape', 'Shape', ['x'], ['s'], { start: 0, end: 1 }),
        node('cast', 'Cast', ['s'], ['n'], { to: F }),
        node('a', 'Add', ['n', 'x'], ['ya']),
        node('b', 'Add', ['n', 'big'], ['yb']),
        node('c', 'Add', ['n', 'small'], ['yc']),
        node('relu', 'Relu', ['x'], ['rx']),
        node('d', 'Add', ['n', 'rx'], ['yd']),
        node('h', 'Cast', ['n'], ['nh'], { to: BF16 }),
        node('k', 'Mul', ['nh', 'hsmall'], ['yk']),
      ],
      [x],
      [init('big', [101], F), init('small', [100], F), init('hsmall', [1], BF16)],
      [
        value('s', I64, [1]),
        value('n', F, [1]),
        value('ya', F, ['B', 'T', 8]),
        value('yb', F, [101]),
        value('yc', F, [100]),
        value('rx', F, ['B', 'T', 8]),
        value('yd', F, ['B', 'T', 8]),
        value('nh', BF16, [1]),
        value('yk', BF16, [1]),
      ],
      ['ya', 'yb', 'yc', 'yd', 'yk'],
    );
    expect(placed(m)).toEqual(['cast:shape computation', 'a:shape computation', 'c:shape computation', 'h:shape computation']);
  });

  test('a node reached only through a device tensor is never a candidate, even when its inputs are graph inputs and constants', () => {
    const m = model([node('gather', 'Gather', ['ids', 'zero'], ['first'])], [value('ids', I64, ['B', 'T', 'K'])], [init('zero', [])], [value('first', I64, ['B', 'T'])], ['first']);
    expect(placed(m)).toEqual([]);
  });

  test('an op without a CUDA kernel is on the CPU, and what it feeds joins it when its other inputs allow', () => {
    // ReduceMax has no bfloat16 CUDA kernel: its output is a CPU tensor; Cast of it alone goes too
    const m = model(
      [node('relu', 'Relu', ['xf'], ['relu']), node('max', 'ReduceMax', ['xb', 'axes'], ['m']), node('cast', 'Cast', ['m'], ['mf'], { to: F }), node('mul', 'Mul', ['mf', 'relu'], ['y'])],
      [value('xb', BF16, ['B', 8]), value('xf', F, ['B', 1])],
      [init('axes', [1])],
      [value('m', BF16, ['B', 1]), value('mf', F, ['B', 1]), value('relu', F, ['B', 1]), value('y', F, ['B', 1])],
      ['y'],
    );
    // Cast reads a bfloat16 input: vetoed; so only the kernel-less node itself
    expect(placed(m)).toEqual(['max:no CUDA kernel']);
    const f32 = model(
      [node('max', 'ReduceMax', ['xb', 'axes'], ['m']), node('neg', 'Neg', ['m'], ['y'])],
      [value('xb', BF16, ['B', 8])],
      [init('axes', [1])],
      [value('m', F, ['B', 1]), value('y', F, ['B', 1])],
      ['y'],
    );
    expect(placed(f32)).toEqual([]);
    // Multinomial has no CUDA kernel at all. Reached from the device it is on the CPU alone (the rule
    // only follows consumers of candidates); reached as a candidate, from a Shape, what it feeds follows
    const sample = (from: string, pre: NodeProto[]) =>
      model(
        [...pre, node('draw', 'Multinomial', [from], ['ids']), node('add', 'Add', ['ids', 'one'], ['y']), node('mul', 'Mul', ['ids', 'big'], ['z'])],
        [value('p', F, ['B', 8]), x],
        [init('one', [1]), init('big', [1000])],
        [value('s', I64, [1]), value('sf', F, [1, 1]), value('ids', I64, ['B', 1]), value('y', I64, ['B', 1]), value('z', I64, ['B', 1000])],
        ['y', 'z'],
      );
    expect(placed(sample('p', []))).toEqual(['draw:no CUDA kernel']);
    const fromShape = [node('shape', 'Shape', ['x'], ['s'], { start: 0, end: 1 }), node('cast', 'Cast', ['s'], ['sf'], { to: F })];
    expect(placed(sample('sf', fromShape))).toEqual(['cast:shape computation', 'draw:no CUDA kernel', 'add:shape computation']);
  });

  test('level-1 rewrites: a Shape of static dims folds to a constant; constant subgraphs fold; a Shape of a Transpose becomes a CPU Gather', () => {
    const staticShape = model(
      [node('shape', 'Shape', ['x'], ['s'], { start: 2 }), node('add', 'Add', ['s', 'one'], ['t']), node('reshape', 'Reshape', ['x', 't'], ['y'])],
      [x],
      [init('one', [1])],
      [value('s', I64, [1]), value('t', I64, [1]), value('y', F, ['?'])],
      ['y'],
    );
    expect(placed(staticShape)).toEqual([]);
    const dynamicShape = model(
      [node('shape', 'Shape', ['x'], ['s'], { start: 0, end: 1 }), node('add', 'Add', ['s', 'one'], ['t']), node('reshape', 'Reshape', ['x', 't'], ['y'])],
      [x],
      [init('one', [1])],
      [value('s', I64, [1]), value('t', I64, [1]), value('y', F, ['?'])],
      ['y'],
    );
    expect(placed(dynamicShape)).toEqual(['add:shape computation']);
    const transposed = (via: NodeProto[]) =>
      model(
        [node('tr', 'Transpose', ['x'], ['xt']), ...via, node('shape', 'Shape', [via.length ? 'v' : 'xt'], ['s']), node('zeros', 'ConstantOfShape', ['s'], ['z'])],
        [x],
        [init('st', [1]), init('en', [1]), init('ax', [1])],
        [value('xt', F, [8, 'T', 'B']), value('v', F, [1, 'T', 'B']), value('s', I64, [3]), value('z', F, ['?', '?', '?'])],
        ['z'],
      );
    expect(placed(transposed([]))).toEqual(['shape:Shape of a Transpose']);
    expect(placed(transposed([node('slice', 'Slice', ['xt', 'st', 'en', 'ax'], ['v'])]))).toEqual(['shape:Shape of a Transpose']);
    expect(placed(transposed([node('relu', 'Relu', ['xt'], ['v'])]))).toEqual([]);
  });

  test('aggressive mode (ORT_AGGRESSIVE_CPU_FALLBACK=1) also moves what computes a shape input, up to Shape nodes', () => {
    // tgt = Relu(Cast(mask)) computed on the device from a graph input, used as Reshape's shape
    const m = model(
      [node('relu', 'Relu', ['n'], ['r']), node('cast', 'Cast', ['r'], ['tgt'], { to: I64 }), node('reshape', 'Reshape', ['x', 'tgt'], ['y'])],
      [x, value('n', F, [3])],
      [],
      [value('r', F, [3]), value('tgt', I64, [3]), value('y', F, ['?', '?', '?'])],
      ['y'],
    );
    expect(placed(m)).toEqual([]);
    expect(placed(m, true)).toEqual(['relu:aggressive fallback', 'cast:aggressive fallback']);
  });
});
