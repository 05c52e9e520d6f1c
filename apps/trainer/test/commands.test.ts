import { commands } from '../src/commands/index';

test('every command has a description', () => {
  for (const c of commands) expect(typeof c.describe).toBe('string');
});
