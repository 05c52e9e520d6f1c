export const PACKAGE_NAME = '@lathe/graders';
