export const PACKAGE_NAME = '@lathe/data';
