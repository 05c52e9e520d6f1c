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

const schema = {
  nested: {
    onnx: {
      nested: {
        StringStringEntryProto: { fields: { key: { type: 'string', id: 1 }, value: { type: 'string', id: 2 } } },
        TensorProto: {
          fields: {
            dims: { rule: 'repeated', type: 'int64', id: 1 },
            dataType: { type: 'int32', id: 2 },
            floatData: { rule: 'repeated', type: 'float', id: 4 },
            int32Data: { rule: 'repeated', type: 'int32', id: 5 },
            int64Data: { rule: 'repeated', type: 'int64', id: 7 },
            name: { type: 'string', id: 8 },
            rawData: { type: 'bytes', id: 9 },
            doubleData: { rule: 'repeated', type: 'double', id: 10 },
            docString: { type: 'string', id: 12 },
            externalData: { rule: 'repeated', type: 'StringStringEntryProto', id: 13 },
            dataLocation: { type: 'int32', id: 14 },
          },
        },
        TensorShapeProto: {
          fields: { dim: { rule: 'repeated', type: 'Dimension', id: 1 } },
          nested: {
            Dimension: {
              oneofs: { value: { oneof: ['dimValue', 'dimParam'] } },
              fields: { dimValue: { type: 'int64', id: 1 }, dimParam: { type: 'string', id: 2 } },
            },
          },
        },
        TypeProto: {
          oneofs: { value: { oneof: ['tensorType'] } },
          fields: { tensorType: { type: 'Tensor', id: 1 } },
          nested: {
            Tensor: { fields: { elemType: { type: 'int32', id: 1 }, shape: { type: 'TensorShapeProto', id: 2 } } },
          },
        },
        ValueInfoProto: {
          fields: { name: { type: 'string', id: 1 }, type: { type: 'TypeProto', id: 2 }, docString: { type: 'string', id: 3 } },
        },
        AttributeProto: {
          fields: {
            name: { type: 'string', id: 1 },
            f: { type: 'float', id: 2 },
            i: { type: 'int64', id: 3 },
            s: { type: 'bytes', id: 4 },
            t: { type: 'TensorProto', id: 5 },
            g: { type: 'GraphProto', id: 6 },
            floats: { rule: 'repeated', type: 'float', id: 7 },
            ints: { rule: 'repeated', type: 'int64', id: 8 },
            strings: { rule: 'repeated', type: 'bytes', id: 9 },
            type: { type: 'int32', id: 20 },
          },
        },
        NodeProto: {
          fields: {
            input: { rule: 'repeated', type: 'string', id: 1 },
            output: { rule: 'repeated', type: 'string', id: 2 },
            name: { type: 'string', id: 3 },
            opType: { type: 'string', id: 4 },
            attribute: { rule: 'repeated', type: 'AttributeProto', id: 5 },
            docString: { type: 'string', id: 6 },
            domain: { type: 'string', id: 7 },
          },
        },
        GraphProto: {
          fields: {
            node: { rule: 'repeated', type: 'NodeProto', id: 1 },
            name: { type: 'string', id: 2 },
            initializer: { rule: 'repeated', type: 'TensorProto', id: 5 },
            docString: { type: 'string', id: 10 },
            input: { rule: 'repeated', type: 'ValueInfoProto', id: 11 },
            output: { rule: 'repeated', type: 'ValueInfoProto', id: 12 },
            valueInfo: { rule: 'repeated', type: 'ValueInfoProto', id: 13 },
          },
        },
        OperatorSetIdProto: { fields: { domain: { type: 'string', id: 1 }, version: { type: 'int64', id: 2 } } },
        ModelProto: {
          fields: {
            irVersion: { type: 'int64', id: 1 },
            producerName: { type: 'string', id: 2 },
            producerVersion: { type: 'string', id: 3 },
            domain: { type: 'string', id: 4 },
            modelVersion: { type: 'int64', id: 5 },
            docString: { type: 'string', id: 6 },
            graph: { type: 'GraphProto', id: 7 },
            opsetImport: { rule: 'repeated', type: 'OperatorSetIdProto', id: 8 },
            metadataProps: { rule: 'repeated', type: 'StringStringEntryProto', id: 14 },
          },
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
