import { PACKAGE_NAME } from '@lathe/onnx';

test('package resolves to its sources', () => {
  expect(PACKAGE_NAME).toBe('@lathe/onnx');
});
