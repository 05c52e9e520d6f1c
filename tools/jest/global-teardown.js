module.exports = require('./temp-root').teardown;
