module.exports = require('./temp-root').setup;
