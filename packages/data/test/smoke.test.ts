import { PACKAGE_NAME } from '@lathe/data';

test('package resolves to its sources', () => {
  expect(PACKAGE_NAME).toBe('@lathe/data');
});
