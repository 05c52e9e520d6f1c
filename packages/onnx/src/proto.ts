/**
 * The subset of ONNX's protobuf schema (onnx/onnx.proto, IR version 10) that Lathe writes and
 * reads, declared as a protobufjs reflection root. Field numbers are those of the ONNX spec; only
 * messages and fields Lathe uses are declared (unknown fields in decoded files are skipped).
 */
import * as protobuf from 'protobufjs';

/** TensorProto.DataType codes from the ONNX spec. */
export const OnnxDataType = {
  UNDEFINED: 0,
  FLOAT: 1,
  UINT8: 2,
  INT8: 3,
  UINT16: 4,
  INT16: 5,
  INT32: 6,
  INT64: 7,
  STRING: 8,
  BOOL: 9,
  FLOAT16: 10,
  DOUBLE: 11,
  UINT32: 12,
  UINT64: 13,
  BFLOAT16: 16,
  UINT4: 21,
  INT4: 22,
} as const;

/** AttributeProto.AttributeType codes. */
export const AttributeType = {
  UNDEFINED: 0,
  FLOAT: 1,
  INT: 2,
  STRING: 3,
  TENSOR: 4,
  GRAPH: 5,
  FLOATS: 6,
  INTS: 7,
  STRINGS: 8,
  TENSORS: 9,
  GRAPHS: 10,
} as const;

/** Plain-object shapes of the messages (what protobufjs's `create`/`encode` accept). */
export interface StringStringEntryProto {
  key: string;
  value: string;
}
export interface TensorProto {
  dims?: number[];
  dataType: number;
  name?: string;
  rawData?: Uint8Array;
  floatData?: number[];
  int32Data?: number[];
  int64Data?: number[];
  doubleData?: number[];
  externalData?: StringStringEntryProto[];
  /** 0 = DEFAULT (data in this message), 1 = EXTERNAL (see externalData). */
  dataLocation?: number;
}
export interface DimensionProto {
  dimValue?: number;
  dimParam?: string;
}
export interface TypeProto {
  tensorType?: { elemType: number; shape?: { dim: DimensionProto[] } };
}
export interface ValueInfoProto {
  name: string;
  type?: TypeProto;
  docString?: string;
}
export interface AttributeProto {
  name: string;
  type: number;
  f?: number;
  i?: number;
  s?: Uint8Array;
  t?: TensorProto;
  g?: GraphProto;
  floats?: number[];
  ints?: number[];
  strings?: Uint8Array[];
}
export interface NodeProto {
  input: string[];
  output: string[];
  name?: string;
  opType: string;
  domain?: string;
  attribute?: AttributeProto[];
  docString?: string;
}
export interface GraphProto {
  node: NodeProto[];
  name: string;
  initializer?: TensorProto[];
  input: ValueInfoProto[];
  output: ValueInfoProto[];
  valueInfo?: ValueInfoProto[];
  docString?: string;
}
export interface OperatorSetIdProto {
  domain: string;
  version: number;
}
export interface ModelProto {
  irVersion: number;
  producerName?: string;
  producerVersion?: string;
  domain?: string;
  modelVersion?: number;
  docString?: string;
  graph: GraphProto;
  opsetImport: OperatorSetIdProto[];
  metadataProps?: StringStringEntryProto[];
}

/** A field as `[id, type]`, or `[id, type, 'repeated']`: the number, type and label of its line in onnx.proto. */
type FieldSpec = readonly [id: number, type: string, rule?: 'repeated'];

/** A message's fields in protobufjs's JSON form, from one {@link FieldSpec} per field name. */
function fields(specs: Record<string, FieldSpec>): Record<string, { rule?: 'repeated'; type: string; id: number }> {
  return Object.fromEntries(Object.entries(specs).map(([name, [id, type, rule]]) => [name, rule ? { rule, type, id } : { type, id }]));
}

/** The repeated label, short so that each message's fields read in a line or two as in onnx.proto. */
const R = 'repeated';

const schema = {
  nested: {
    onnx: {
      nested: {
        StringStringEntryProto: { fields: fields({ key: [1, 'string'], value: [2, 'string'] }) },
        TensorProto: {
          fields: fields({
            dims: [1, 'int64', R], dataType: [2, 'int32'], floatData: [4, 'float', R], int32Data: [5, 'int32', R], int64Data: [7, 'int64', R], name: [8, 'string'],
            rawData: [9, 'bytes'], doubleData: [10, 'double', R], docString: [12, 'string'], externalData: [13, 'StringStringEntryProto', R], dataLocation: [14, 'int32'],
          }),
        },
        TensorShapeProto: {
          fields: fields({ dim: [1, 'Dimension', R] }),
          nested: {
            Dimension: { oneofs: { value: { oneof: ['dimValue', 'dimParam'] } }, fields: fields({ dimValue: [1, 'int64'], dimParam: [2, 'string'] }) },
          },
        },
        TypeProto: {
          oneofs: { value: { oneof: ['tensorType'] } },
          fields: fields({ tensorType: [1, 'Tensor'] }),
          nested: { Tensor: { fields: fields({ elemType: [1, 'int32'], shape: [2, 'TensorShapeProto'] }) } },
        },
        ValueInfoProto: { fields: fields({ name: [1, 'string'], type: [2, 'TypeProto'], docString: [3, 'string'] }) },
        AttributeProto: {
          fields: fields({
            name: [1, 'string'], f: [2, 'float'], i: [3, 'int64'], s: [4, 'bytes'], t: [5, 'TensorProto'], g: [6, 'GraphProto'],
            floats: [7, 'float', R], ints: [8, 'int64', R], strings: [9, 'bytes', R], type: [20, 'int32'],
          }),
        },
        NodeProto: {
          fields: fields({
            input: [1, 'string', R], output: [2, 'string', R], name: [3, 'string'], opType: [4, 'string'], attribute: [5, 'AttributeProto', R], docString: [6, 'string'], domain: [7, 'string'],
          }),
        },
        GraphProto: {
          fields: fields({
            node: [1, 'NodeProto', R], name: [2, 'string'], initializer: [5, 'TensorProto', R], docString: [10, 'string'],
            input: [11, 'ValueInfoProto', R], output: [12, 'ValueInfoProto', R], valueInfo: [13, 'ValueInfoProto', R],
          }),
        },
        OperatorSetIdProto: { fields: fields({ domain: [1, 'string'], version: [2, 'int64'] }) },
        ModelProto: {
          fields: fields({
            irVersion: [1, 'int64'], producerName: [2, 'string'], producerVersion: [3, 'string'], domain: [4, 'string'], modelVersion: [5, 'int64'], docString: [6, 'string'],
            graph: [7, 'GraphProto'], opsetImport: [8, 'OperatorSetIdProto', R], metadataProps: [14, 'StringStringEntryProto', R],
          }),
        },
      },
    },
  },
};

const root = protobuf.Root.fromJSON(schema);
const ModelProtoType = root.lookupType('onnx.ModelProto');

/** Encodes a model to ONNX protobuf bytes. */
export function encodeModelProto(model: ModelProto): Uint8Array {
  const message = ModelProtoType.fromObject(model as unknown as Record<string, unknown>);
  return ModelProtoType.encode(message).finish();
}

/** Decodes ONNX protobuf bytes (int64 fields become plain numbers). */
export function decodeModelProto(bytes: Uint8Array): ModelProto {
  const message = ModelProtoType.decode(bytes);
  return ModelProtoType.toObject(message, { longs: Number, bytes: Uint8Array, defaults: false, arrays: true }) as unknown as ModelProto;
}
