export const PACKAGE_NAME = '@lathe/tokenizer';
