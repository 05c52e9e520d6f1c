/**
 * runtimeShapeNodes on hand-built graphs, against ONNX Runtime's placement rule worked by hand: int64
 * arithmetic on a Shape output of a run-time shape runs on the CPU, a Shape of static dims is folded
 * away, a Shape output read as Reshape's shape input stays on the device, and a Shape of a
 * Transpose (also through a Slice or a Reshape) is rewritten into a CPU Gather.
 */
import * as L from '@lathe/onnx';

const flagged = (g: L.Graph) => L.runtimeShapeNodes(g).map((n) => n.op.name);

test('int64 arithmetic on a run-time shape is listed; the Shape itself is not', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', ['B', 4]);
  const doubled = L.mul(L.shapeOf(x, 0, 1), g.constant([2], 'int64', [1]));
  g.output(L.add(doubled, g.constant([1], 'int64', [1])), 'n');
  expect(flagged(g)).toEqual(['Mul', 'Add']);
});

test('the same arithmetic on static dims is folded: nothing listed', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [3, 4]);
  g.output(L.mul(L.shapeOf(x, 0, 1), g.constant([2], 'int64', [1])), 'n');
  expect(flagged(g)).toEqual([]);
});

test('a graph input beside the Shape output keeps the node on the CPU (ORT counts graph inputs as CPU-placeable)', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', ['B', 4]);
  const extra = g.input('extra', 'int64', [1]);
  g.output(L.add(L.shapeOf(x, 0, 1), extra), 'n');
  expect(flagged(g)).toEqual(['Add']);
});

test("a Shape output read directly as Reshape's shape stays on the device", () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', ['B', 4]);
  const y = g.input('y', 'float32', ['B*4']);
  g.output(L.reshapeLike(y, x), 'r');
  expect(flagged(g)).toEqual([]);
});

test('a Shape of a Transpose, directly or through a Slice or a Reshape, is listed (ORT makes it a CPU Gather)', () => {
  for (const through of ['none', 'slice', 'reshape'] as const) {
    const g = new L.Graph();
    const x = g.input('x', 'float32', ['B', 'T']);
    const t = L.transpose(x, [1, 0]);
    const shaped = { none: t, slice: L.slice(t, [0], [0], [1]), reshape: L.reshape(t, ['T', 'B', 1]) }[through];
    const y = g.input('y', 'float32', [{ none: 'T*B', slice: 'B', reshape: 'T*B' }[through]]);
    g.output(L.reshapeLike(y, shaped), 'r');
    expect([through, flagged(g)]).toEqual([through, ['Shape']]);
  }
});
