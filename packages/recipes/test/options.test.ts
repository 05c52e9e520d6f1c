/** The option schemas refuse values outside an option's range by name, whichever command has it. */
import { grpoSchema, resolveConfig, sftSchema } from '@lathe/recipes';

test('lora_dropout outside [0, 1) is refused by name in the sft and grpo schemas', () => {
  for (const schema of [sftSchema, grpoSchema]) {
    for (const bad of [-0.1, 1]) expect(() => resolveConfig(schema, [{ name: 'command line', values: { lora_dropout: bad } }])).toThrow(/command line: option 'lora_dropout' must be/);
    expect(resolveConfig(schema, [{ name: 'command line', values: { lora_dropout: 0.05 } }]).lora_dropout).toBe(0.05);
  }
});
