import { PACKAGE_NAME } from '@lathe/runtime';

test('package resolves to its sources', () => {
  expect(PACKAGE_NAME).toBe('@lathe/runtime');
});
