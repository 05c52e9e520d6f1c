import { PACKAGE_NAME } from '@lathe/tokenizer';

test('package resolves to its sources', () => {
  expect(PACKAGE_NAME).toBe('@lathe/tokenizer');
});
