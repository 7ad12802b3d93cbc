// Bundled by `make ui-assets` into assets/vendor/xterm.js: xterm.js and its
// fit add-on from the Debian package node-xterm, as one browser script
// that defines window.Terminal.
var Terminal = require('xterm').Terminal;
var fit = require('xterm/lib/addons/fit/fit');
Terminal.applyAddon(fit);
window.Terminal = Terminal;
