/**
 * Arrow columns as Lathe uses them: a small vocabulary of column kinds (integers, floats, strings,
 * lists and lists of lists of numbers), checks of a table's schema against expected kinds with errors
 * naming the column, and fast builders from flat typed arrays (values + offsets), so big token
 * columns never pass through per-row JavaScript objects.
 */
import * as arrow from 'apache-arrow';

/** The kinds of column Lathe's schemas use; widths are the canonical ones written to files. */
export type ColumnKind =
  | 'int64'
  | 'int32'
  | 'float32'
  | 'string'
  | 'bool'
  | 'list<int32>'
  | 'list<float32>'
  | 'list<list<int32>>'
  | 'list<list<float32>>';

/** One expected column: its name, kind, whether it must be present and whether nulls are allowed. */
export interface ColumnSpec {
  name: string;
  kind: ColumnKind;
  /** Must be present in a table (otherwise optional). */
  required: boolean;
  /** Null values are allowed (otherwise a null is a row error). */
  nullable: boolean;
  /** What the column holds (for docs and error messages). */
  describe: string;
}

const isInt = (t: arrow.DataType) => t.typeId === arrow.Type.Int;
const isFloat = (t: arrow.DataType) => t.typeId === arrow.Type.Float;
const isString = (t: arrow.DataType) => t.typeId === arrow.Type.Utf8 || t.typeId === arrow.Type.LargeUtf8;
const isList = (t: arrow.DataType): t is arrow.List => t.typeId === arrow.Type.List;
const child = (t: arrow.List) => t.children[0].type as arrow.DataType;

/**
 * Whether a column's Arrow type can be read as `kind`: integer kinds accept any integer width,
 * float kinds any float width (values are converted on read), strings also large strings.
 */
export function typeMatches(type: arrow.DataType, kind: ColumnKind): boolean {
  switch (kind) {
    case 'int64':
    case 'int32':
      return isInt(type);
    case 'float32':
      return isFloat(type);
    case 'string':
      return isString(type);
    case 'bool':
      return type.typeId === arrow.Type.Bool;
    case 'list<int32>':
      return isList(type) && isInt(child(type));
    case 'list<float32>':
      return isList(type) && isFloat(child(type));
    case 'list<list<int32>>':
      return isList(type) && isList(child(type)) && isInt(child(child(type) as arrow.List));
    case 'list<list<float32>>':
      return isList(type) && isList(child(type)) && isFloat(child(child(type) as arrow.List));
  }
}

/** The canonical Arrow type written for a kind. */
export function arrowType(kind: ColumnKind): arrow.DataType {
  const list = (t: arrow.DataType) => new arrow.List(new arrow.Field('item', t, true));
  switch (kind) {
    case 'int64':
      return new arrow.Int64();
    case 'int32':
      return new arrow.Int32();
    case 'float32':
      return new arrow.Float32();
    case 'string':
      return new arrow.Utf8();
    case 'bool':
      return new arrow.Bool();
    case 'list<int32>':
      return list(new arrow.Int32());
    case 'list<float32>':
      return list(new arrow.Float32());
    case 'list<list<int32>>':
      return list(list(new arrow.Int32()));
    case 'list<list<float32>>':
      return list(list(new arrow.Float32()));
  }
}

/**
 * Checks a schema against expected columns: a missing required column or a column of the wrong type
 * is an error naming `where` (a file), the column, the type found and the type expected. Columns not
 * in `specs` are allowed.
 */
export function checkSchema(schema: arrow.Schema, specs: readonly ColumnSpec[], where: string): void {
  const have = new Map(schema.fields.map((f) => [f.name, f]));
  for (const spec of specs) {
    const f = have.get(spec.name);
    if (!f) {
      if (spec.required) throw new Error(`${where}: missing column '${spec.name}' (${spec.kind}: ${spec.describe}); the file has ${[...have.keys()].map((k) => `'${k}'`).join(', ') || 'no columns'}`);
      continue;
    }
    if (!typeMatches(f.type, spec.kind)) throw new Error(`${where}: column '${spec.name}' has type ${String(f.type)}, expected ${spec.kind} (${spec.describe})`);
  }
}

/** Flat values and offsets of a list column: row i holds `values[offsets[i] .. offsets[i+1])`. */
export interface FlatList<V extends Int32Array | Float32Array> {
  values: V;
  /** `rows + 1` offsets, starting at 0. */
  offsets: Int32Array;
}

/** A list column's Data from its parts (arrow's `makeData` overloads do not type nested children). */
export function makeListData(props: { type: arrow.List; length: number; valueOffsets: Int32Array; child: arrow.Data; nullCount?: number; nullBitmap?: Uint8Array }): arrow.Data<arrow.List> {
  const make = arrow.makeData as (p: typeof props) => arrow.Data<arrow.List>;
  return make({ nullCount: 0, ...props });
}

/** A list<int32> or list<float32> column's Data from flat values and offsets (no per-row work). */
export function listData<V extends Int32Array | Float32Array>(list: FlatList<V>): arrow.Data<arrow.List> {
  const inner = list.values instanceof Int32Array ? new arrow.Int32() : new arrow.Float32();
  const type = new arrow.List(new arrow.Field('item', inner, true));
  const rows = list.offsets.length - 1;
  if (rows < 0 || list.offsets[0] !== 0 || list.offsets[rows] !== list.values.length) {
    throw new Error(`list column: offsets must start at 0 and end at values.length (${list.values.length}), got ${list.offsets[0]}..${list.offsets[rows]}`);
  }
  const values = (arrow.makeData as (p: { type: arrow.DataType; length: number; data: Int32Array | Float32Array }) => arrow.Data)({ type: inner, length: list.values.length, data: list.values });
  return makeListData({ type, length: rows, valueOffsets: list.offsets, child: values });
}

/** A list<list<…>> column's Data: `outer` offsets index into the inner lists. */
export function nestedListData<V extends Int32Array | Float32Array>(outer: Int32Array, inner: FlatList<V>): arrow.Data<arrow.List> {
  const innerData = listData(inner);
  const type = new arrow.List(new arrow.Field('item', innerData.type, true));
  const rows = outer.length - 1;
  if (rows < 0 || outer[0] !== 0 || outer[rows] !== innerData.length) throw new Error(`nested list column: outer offsets must start at 0 and end at ${innerData.length}`);
  return makeListData({ type, length: rows, valueOffsets: outer, child: innerData });
}

/** Flattens per-row number arrays (nulls as empty lists) into values and offsets. */
export function flattenLists<V extends Int32Array | Float32Array>(rows: readonly (ArrayLike<number> | null | undefined)[], make: (n: number) => V): FlatList<V> {
  const offsets = new Int32Array(rows.length + 1);
  let n = 0;
  for (let i = 0; i < rows.length; i++) {
    n += rows[i]?.length ?? 0;
    offsets[i + 1] = n;
  }
  const values = make(n);
  for (let i = 0; i < rows.length; i++) {
    const r = rows[i];
    if (r) values.set(r, offsets[i]);
  }
  return { values, offsets };
}

/** Flattens per-row lists of number arrays into outer offsets and one inner flat list. */
export function flattenNested<V extends Int32Array | Float32Array>(rows: readonly (readonly ArrayLike<number>[] | null | undefined)[], make: (n: number) => V): { outer: Int32Array; inner: FlatList<V> } {
  const outer = new Int32Array(rows.length + 1);
  const all: ArrayLike<number>[] = [];
  for (let i = 0; i < rows.length; i++) {
    for (const l of rows[i] ?? []) all.push(l);
    outer[i + 1] = all.length;
  }
  return { outer, inner: flattenLists(all, make) };
}

/** A column's Data from per-row values for scalar kinds, with nulls where a value is null/undefined. */
export function scalarData(kind: 'int64' | 'int32' | 'float32' | 'string' | 'bool', values: readonly unknown[]): arrow.Data {
  return arrow.vectorFromArray(values.map((v) => (v === undefined ? null : kind === 'int64' && typeof v === 'number' ? BigInt(v) : v)) as unknown[], arrowType(kind)).data[0];
}

/** A record batch from named column Data of equal length. */
export function batchOf(columns: { name: string; data: arrow.Data; nullable?: boolean }[]): arrow.RecordBatch {
  const length = columns[0]?.data.length ?? 0;
  for (const c of columns) if (c.data.length !== length) throw new Error(`column '${c.name}' has ${c.data.length} rows, column '${columns[0].name}' has ${length}`);
  const fields = columns.map((c) => new arrow.Field(c.name, c.data.type, c.nullable ?? c.data.nullCount > 0));
  const schema = new arrow.Schema(fields);
  const struct = arrow.makeData({ type: new arrow.Struct(fields), length, nullCount: 0, children: columns.map((c) => c.data) });
  return new arrow.RecordBatch(schema, struct);
}

/** Row `i` of an integer/float list column as a JS number array (int64 values converted). */
export function listAt(vector: arrow.Vector, i: number): number[] | null {
  const v = vector.get(i) as arrow.Vector | null;
  if (v === null || v === undefined) return null;
  return Array.from(v.toArray() as ArrayLike<number | bigint>, Number);
}
