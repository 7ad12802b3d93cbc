# Shared by the maintainer scripts of both packages; package.sh puts it in
# front of each script, so every installed script is self-contained.
#
# They run under dpkg (deb) and rpm alike, and must work where systemd is
# not running: image builds, chroots, containers. So systemctl is used only
# when it is installed, and a unit is started, stopped or restarted only on
# a system booted with systemd (/run/systemd/system, as sd_booted(3)).
# Enabling works offline, so an image built with the package starts the
# unit at its first boot.

has_systemctl() { command -v systemctl >/dev/null 2>&1; }
booted() { has_systemctl && [ -d /run/systemd/system ]; }
warn() { echo "$pkg: $*" >&2; }

# The step a script is called for, from dpkg's or rpm's arguments:
# install, upgrade, remove, purge, or nothing to do.
#   dpkg: postinst configure [OLD]; prerm/postrm remove|upgrade|purge|…
#   rpm:  %pre/%post 1 (install) or 2+ (upgrade); %preun/%postun 0 (erase) or 1+ (upgrade)
step() {
	case "$1" in
	configure) if [ -n "${2:-}" ]; then echo upgrade; else echo install; fi ;;
	install) echo install ;;
	abort-upgrade | abort-remove | abort-deconfigure) echo upgrade ;;
	remove | purge | upgrade) echo "$1" ;;
	0) echo remove ;;
	1) if [ "$script" = pre ] || [ "$script" = post ]; then echo install; else echo upgrade; fi ;;
	[0-9]*) echo upgrade ;;
	*) echo none ;;
	esac
}

daemon_reload() {
	if booted; then systemctl daemon-reload >/dev/null 2>&1 || warn "systemctl daemon-reload failed"; fi
}

enable_unit() {
	if has_systemctl; then
		systemctl enable "$unit" >/dev/null 2>&1 || warn "could not enable $unit; run: systemctl enable $unit"
	fi
}

start_unit() {
	if booted; then systemctl start "$unit" || warn "$unit did not start; see: journalctl -u $unit"; fi
}

# A unit that was running gets the new binary; one that was stopped stays
# stopped.
restart_if_running() {
	if booted; then systemctl try-restart "$unit" || warn "$unit did not restart; see: journalctl -u $unit"; fi
}

stop_unit() {
	if booted; then systemctl stop "$unit" >/dev/null 2>&1 || true; fi
}

# Removal stops the unit but leaves its enablement (a symlink that points
# nowhere until the package is installed again), so a reinstall, which dpkg
# reports as an upgrade from the kept configuration, finds the unit as the
# admin left it. Purge forgets it. The symlink is removed by hand: systemctl
# disable needs the unit file, which is gone by then.
forget_unit() {
	rm -f "/etc/systemd/system/multi-user.target.wants/$unit"
	daemon_reload
}
