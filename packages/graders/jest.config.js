// The code sandbox's tests need bubblewrap and friends: installed or asked for before any test runs.
module.exports = { ...require('../../jest.preset.js')(__dirname), globalSetup: require.resolve('../../tools/jest/system-deps.js') };
