import { PACKAGE_NAME } from '@lathe/graders';

test('package resolves to its sources', () => {
  expect(PACKAGE_NAME).toBe('@lathe/graders');
});
