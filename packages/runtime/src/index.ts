export const PACKAGE_NAME = '@lathe/runtime';
