export const PACKAGE_NAME = '@lathe/onnx';
export * from './proto';
