export const PACKAGE_NAME = '@lathe/onnx';
