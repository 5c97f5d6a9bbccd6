#!/usr/bin/env bash
# install.sh: installs sparkrt on a DGX Spark node as a hardened systemd
# service that refuses to start when its model would not fit.
#
#   sudo ./install.sh --profile qwen3-30b-a3b-nvfp4 --model-dir /srv/models/qwen3-30b-a3b-fp4
#   ./install.sh --profile P --model-dir DIR --root /tmp/stage --binary target/debug/sparkrt
#   sudo ./install.sh --uninstall
#
# What it does, in order: checks the machine (architecture, GPU and driver,
# toolchain), builds or takes the binaries (`sparkrt` and the monitor
# `sparkrt-top` that `sparkrt top` runs), runs `sparkrt plan` as a preflight
# (a plan that does not fit stops here, before anything is written), reports
# the kubelet's allocatable memory, installs the binaries, the profiles, a
# config and the unit, creates the system user, then enables and starts the
# service. Every file it adds is listed in /etc/sparkrt/install-manifest,
# which --uninstall reads. Running it twice changes nothing the second time.
# It never downloads anything.
#
# With --root DIR everything is written below DIR and nothing on this host
# changes: no systemctl, no useradd; enabling is recorded as the symlink
# `systemctl enable` would make. --dry-run prints every action and writes
# nothing at all.
#
# Exit codes: 0 done, 1 failure, 2 bad usage, 3 the plan does not fit.

set -euo pipefail
# Bash 5.2 expands '&' in ${var//pattern/replacement}; values are literal here.
shopt -u patsub_replacement 2>/dev/null || true

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly SCRIPT_DIR
readonly SERVICE_USER=sparkrt
readonly UNIT_NAME=sparkrt.service
readonly UNIT_PATH=/etc/systemd/system/$UNIT_NAME
readonly WANTS_LINK=/etc/systemd/system/multi-user.target.wants/$UNIT_NAME
readonly CONFIG_DIR=/etc/sparkrt
readonly CONFIG_PATH=$CONFIG_DIR/sparkrt.env
readonly PROFILES_DIR=$CONFIG_DIR/profiles
readonly MANIFEST_PATH=$CONFIG_DIR/install-manifest
readonly CACHE_PATH=/var/cache/sparkrt
readonly KUBELET_CONFIG=/var/lib/kubelet/config.yaml
readonly EXIT_USAGE=2
readonly EXIT_DOES_NOT_FIT=3
# The monitor's binary, installed beside sparkrt (`sparkrt top` runs it).
readonly MONITOR_NAME=sparkrt-top

profile=""
model_dir=""
prefix=/usr/local
binary=""
monitor=""
root=""
host_root=/
listen=127.0.0.1
port=8000
api_key_file=""
insecure_no_api_key=0
dry_run=0
uninstall=0
no_start=0

# Filled while installing: manifest lines ("dir|file|link|user PATH") and
# the number of things this run changed.
added=()
changes=0
# Folders a dry run has already announced (they are not really created).
declare -A announced_dirs=()

usage() {
	cat <<'EOF'
usage: install.sh --profile NAME --model-dir DIR [options]
       install.sh --uninstall [--root DIR] [--dry-run]

  --profile NAME      a profile in profiles/ (or a path to a .toml file)
  --model-dir DIR     the checkpoint folder the service reads (absolute path)
  --prefix DIR        where bin/sparkrt goes (default /usr/local)
  --binary PATH       install this binary instead of building one with cargo
                      (and the sparkrt-top beside it)
  --listen ADDR       address the service listens on (default 127.0.0.1)
  --port N            port (default 8000)
  --api-key-file F    file holding the API key clients must send (needed
                      when --listen is not loopback)
  --insecure-no-api-key  listen on a non-loopback address without a key
  --root DIR          install below DIR (a staging tree); the host is not touched
  --host-root DIR     plan against the host tree below DIR (default /)
  --dry-run           print every action, change nothing
  --no-start          enable the service but do not start it
  --uninstall         remove everything a previous run added
  -h, --help          this text
EOF
}

say() { printf '%s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
	printf 'error: %s\n' "$1" >&2
	exit "${2:-1}"
}

# The addresses sparkrt serve treats as loopback (127.0.0.0/8, ::1, localhost).
loopback() {
	local address=${1,,}
	[[ $address == 127.* || $address == localhost || $address == ::1 || $address == '[::1]' ||
		$address == ::ffff:127.* || $address == '[::ffff:127.'* ]]
}

parse_args() {
	while (($#)); do
		local flag=$1
		case $flag in
		-h | --help)
			usage
			exit 0
			;;
		--dry-run) dry_run=1 ;;
		--uninstall) uninstall=1 ;;
		--no-start) no_start=1 ;;
		--insecure-no-api-key) insecure_no_api_key=1 ;;
		--profile | --model-dir | --prefix | --binary | --root | --host-root | --listen | --port | --api-key-file)
			(($# >= 2)) || die "$flag needs a value" "$EXIT_USAGE"
			case $flag in
			--profile) profile=$2 ;;
			--model-dir) model_dir=$2 ;;
			--prefix) prefix=$2 ;;
			--binary) binary=$2 ;;
			--root) root=$2 ;;
			--host-root) host_root=$2 ;;
			--listen) listen=$2 ;;
			--port) port=$2 ;;
			--api-key-file) api_key_file=$2 ;;
			esac
			shift
			;;
		*) die "unknown option $flag (see --help)" "$EXIT_USAGE" ;;
		esac
		shift
	done
}

# A path that goes into the unit or its environment file: absolute, and free
# of what systemd would read as quoting, a specifier (%), a variable ($) or a
# source:destination separator (:).
check_unit_path() {
	local what=$1 path=$2
	local unsafe="[[:space:]%\$\\\"':\`;]"
	[[ $path == /?* ]] || die "$what must be an absolute path below /, not '$path'" "$EXIT_USAGE"
	if [[ $path =~ $unsafe ]]; then
		die "$what '$path' has characters a systemd unit cannot carry literally" "$EXIT_USAGE"
	fi
}

validate_args() {
	if [[ -n $root ]]; then
		[[ $root == /* ]] || root="$PWD/$root"
		[[ -d $root ]] || die "--root $root is not a directory" "$EXIT_USAGE"
		root=${root%/}
	fi
	((uninstall)) && return 0
	[[ -n $profile ]] || die "--profile is required (see --help)" "$EXIT_USAGE"
	[[ -n $model_dir ]] || die "--model-dir is required (see --help)" "$EXIT_USAGE"
	check_unit_path --model-dir "$model_dir"
	model_dir=${model_dir%/}
	check_unit_path --prefix "$prefix"
	prefix=${prefix%/}
	if ! [[ $port =~ ^[0-9]{1,5}$ ]] || ((10#$port < 1 || 10#$port > 65535)); then
		die "--port must be a number from 1 to 65535, not '$port'" "$EXIT_USAGE"
	fi
	port=$((10#$port))
	[[ $listen =~ ^[][0-9A-Za-z.:-]+$ ]] || die "--listen '$listen' is not an address" "$EXIT_USAGE"
	if [[ -n $api_key_file ]]; then
		check_unit_path --api-key-file "$api_key_file"
	elif ! loopback "$listen" && ((!insecure_no_api_key)); then
		# sparkrt serve itself refuses this (exit 2) at every start.
		die "--listen $listen is not loopback: pass --api-key-file F, or --insecure-no-api-key to serve without a key" "$EXIT_USAGE"
	fi
	[[ -d $host_root ]] || die "--host-root $host_root is not a directory" "$EXIT_USAGE"
	if [[ -n $binary ]]; then
		[[ -f $binary && -x $binary ]] || die "--binary $binary is not an executable file" "$EXIT_USAGE"
		monitor=$(dirname "$binary")/$MONITOR_NAME
		[[ -f $monitor && -x $monitor ]] ||
			die "--binary $binary: no executable $MONITOR_NAME beside it (the monitor \`sparkrt top\` runs; \`cargo build --release\` builds both)" "$EXIT_USAGE"
	fi
	case $model_dir in
	/home/* | /root/* | /run/user/*)
		say "note: $model_dir is below a home directory; the unit hides homes (ProtectHome=tmpfs) and binds only this folder, read-only"
		;;
	esac
}

# The path of PATH in the tree being installed: below --root, or the host's.
target() { printf '%s%s' "$root" "$1"; }

staging() { [[ -n $root ]]; }

# Runs a command that changes the host, or says it would.
host_run() {
	if ((dry_run)); then
		say "would run: $*"
	elif staging; then
		say "would run on the host: $*"
	else
		say "running: $*"
		"$@"
	fi
}

# ---------------------------------------------------------------- checks

check_machine() {
	local arch
	arch=$(uname -m)
	if [[ $arch == aarch64 ]]; then
		say "architecture: $arch"
	else
		warn "architecture $arch: a DGX Spark is aarch64; continuing (the CPU backend runs anywhere)"
	fi
	if command -v nvidia-smi >/dev/null 2>&1; then
		local gpu
		if gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null) && [[ -n $gpu ]]; then
			say "GPU and driver: $gpu"
			[[ $gpu == *GB10* ]] || warn "no GB10 among the GPUs; profiles are sized for a DGX Spark"
		else
			warn "nvidia-smi is installed but answered nothing: is the driver loaded?"
		fi
	else
		warn "no NVIDIA driver (nvidia-smi not found): sparkrt will use its CPU backend"
	fi
}

# Sets `binary` and `monitor`: the ones given, or built from this source tree.
obtain_binary() {
	if [[ -n $binary ]]; then
		say "binary: $binary ($("$binary" --version 2>/dev/null || echo 'no --version'))"
		return 0
	fi
	command -v cargo >/dev/null 2>&1 ||
		die "no cargo on PATH: install a Rust toolchain, or pass --binary PATH"
	say "toolchain: $(cargo --version)"
	binary=$SCRIPT_DIR/target/release/sparkrt
	monitor=$SCRIPT_DIR/target/release/$MONITOR_NAME
	local build=(cargo build --release --locked --bin sparkrt --bin "$MONITOR_NAME")
	if ((dry_run)); then
		say "would run: ${build[*]} (in $SCRIPT_DIR)"
		[[ -x $binary ]] || binary=""
		[[ -x $monitor ]] || monitor=""
	else
		say "building: ${build[*]}"
		(cd "$SCRIPT_DIR" && "${build[@]}")
	fi
}

# The profile file: a path, or a name in profiles/.
profile_source() {
	if [[ -f $profile ]]; then
		printf '%s' "$profile"
	elif [[ -f $SCRIPT_DIR/profiles/${profile%.toml}.toml ]]; then
		printf '%s' "$SCRIPT_DIR/profiles/${profile%.toml}.toml"
	else
		die "no profile '$profile': not a file and not in $SCRIPT_DIR/profiles" "$EXIT_USAGE"
	fi
}

# Runs `sparkrt plan` against the host; stops here when it does not fit.
preflight() {
	local source=$1
	if [[ -z $binary ]]; then
		warn "no binary built yet: the preflight plan is skipped in this dry run"
		return 0
	fi
	local args=(plan --profile "$source" --host-root "$host_root")
	if [[ -d $model_dir ]]; then
		args+=(--model "$model_dir")
	else
		warn "model folder $model_dir does not exist yet: planning from the profile's geometry"
	fi
	local output status=0
	output=$("$binary" "${args[@]}" 2>&1) || status=$?
	case $status in
	0) say "preflight: $(grep -E '^FITS' <<<"$output" || echo 'the plan fits')" ;;
	"$EXIT_DOES_NOT_FIT")
		say "$output"
		die "the plan does not fit this host: nothing was installed or enabled" "$EXIT_DOES_NOT_FIT"
		;;
	*)
		say "$output"
		die "the preflight plan failed (exit $status): nothing was installed" "$status"
		;;
	esac
}

# The first number after "KEY": in the probe's JSON, or empty.
json_number() {
	grep -oE "\"$1\": [0-9]+" <<<"$2" | head -n 1 | grep -oE '[0-9]+$' || true
}

gib() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'; }

# Node allocatable memory as the kubelet computes it.
report_kubelet() {
	if [[ ! -f $host_root$KUBELET_CONFIG ]]; then
		say "kubelet: no $KUBELET_CONFIG; the plan uses the host's own headroom"
		return 0
	fi
	[[ -n $binary ]] || return 0
	local probe total system kube eviction
	probe=$("$binary" probe --host-root "$host_root" --json) ||
		die "sparkrt probe could not read the host below $host_root"
	total=$(json_number mem_total "$probe")
	system=$(json_number system_reserved "$probe")
	kube=$(json_number kube_reserved "$probe")
	eviction=$(json_number eviction_hard_bytes "$probe")
	if [[ -z $total || -z $system || -z $kube || -z $eviction ]]; then
		warn "could not read the kubelet's reservations from sparkrt probe"
		return 0
	fi
	local allocatable=$((total - system - kube - eviction))
	say "kubelet: $KUBELET_CONFIG found; node allocatable memory $(gib "$allocatable")" \
		"(MemTotal $(gib "$total") - systemReserved $(gib "$system") - kubeReserved $(gib "$kube") - evictionHard $(gib "$eviction"))"
	say "kubelet: sparkrt runs beside the kubelet, whose pods cannot see its memory; the plan keeps clear of their reservations"
}

# ---------------------------------------------------------- file writing

# Creates DIR and any missing parents in the target tree, recording each.
ensure_dir() {
	local dir=$1 path="" part
	local -a parts
	IFS=/ read -r -a parts <<<"${dir#/}"
	for part in "${parts[@]}"; do
		path+="/$part"
		[[ -d $(target "$path") || -v announced_dirs[$path] ]] && continue
		changes=$((changes + 1))
		if ((dry_run)); then
			say "would create $path/"
			announced_dirs[$path]=1
		else
			mkdir -m 0755 "$(target "$path")"
			say "created $path/"
			added+=("dir $path")
		fi
	done
}

# Installs SOURCE (a file) at DEST with MODE, unless it is there already.
install_file() {
	local source=$1 dest=$2 mode=$3
	local real
	real=$(target "$dest")
	added+=("file $dest")
	if [[ -f $real && ! -L $real ]] && cmp -s "$source" "$real" && [[ $(stat -c %a "$real") == "${mode#0}" ]]; then
		say "unchanged $dest"
		return 0
	fi
	ensure_dir "$(dirname "$dest")"
	changes=$((changes + 1))
	if ((dry_run)); then
		say "would write $dest (mode $mode)"
		return 0
	fi
	# Write beside the destination, then rename: a running binary is never
	# overwritten in place and a reader never sees half a file.
	local tmp
	tmp=$(mktemp "$real.XXXXXX")
	cp "$source" "$tmp"
	chmod "$mode" "$tmp"
	mv -f "$tmp" "$real"
	say "wrote $dest (mode $mode)"
}

# Installs TEXT (given on stdin) at DEST with MODE.
install_text() {
	local dest=$1 mode=$2 tmp
	tmp=$(mktemp)
	cat >"$tmp"
	local status=0
	install_file "$tmp" "$dest" "$mode" || status=$?
	rm -f "$tmp"
	return "$status"
}

# Replaces each @KEY@ in a template with its value: render FILE KEY VALUE...
render() {
	local text key value
	text=$(<"$1")
	shift
	while (($#)); do
		key=$1 value=$2
		text=${text//"@$key@"/"$value"}
		shift 2
	done
	if [[ $text =~ @[A-Z_]+@ ]]; then
		die "template left ${BASH_REMATCH[0]} unfilled"
	fi
	printf '%s\n' "$text"
}

# ---------------------------------------------------------------- install

install_profiles() {
	local profile_src=$1 file name
	for file in "$SCRIPT_DIR"/profiles/*.toml; do
		install_file "$file" "$PROFILES_DIR/$(basename "$file")" 0644
	done
	# A profile given as a path joins the shipped ones under its own name.
	name=$(basename "$profile_src")
	if [[ ! $profile_src -ef $SCRIPT_DIR/profiles/$name ]]; then
		if [[ -f $SCRIPT_DIR/profiles/$name ]] && ! cmp -s "$profile_src" "$SCRIPT_DIR/profiles/$name"; then
			die "profile $profile_src has the name of a shipped profile but differs from it: rename it" "$EXIT_USAGE"
		fi
		install_file "$profile_src" "$PROFILES_DIR/$name" 0644
	fi
}

install_config() {
	local profile_file=$1
	local plan_args="" serve_args=""
	# An explicit --kubelet-config makes an unreadable kubelet config an error
	# at start instead of a plan that silently ignores the kubelet.
	if [[ -f $host_root$KUBELET_CONFIG ]]; then
		plan_args="--kubelet-config $KUBELET_CONFIG"
	fi
	if [[ -n $api_key_file ]]; then
		serve_args="--api-key-file $api_key_file"
		[[ -f $(target "$api_key_file") ]] ||
			warn "API key file $api_key_file does not exist yet: create it, readable by user $SERVICE_USER"
	elif ! loopback "$listen"; then
		serve_args="--insecure-no-api-key"
		warn "listening on $listen without --api-key-file (--insecure-no-api-key): anyone who reaches port $port can use the model"
	fi
	local text
	text=$(render "$SCRIPT_DIR/deploy/sparkrt.env.in" \
		UNIT "$UNIT_PATH" \
		PROFILE "$PROFILES_DIR/$profile_file" \
		MODEL_DIR "$model_dir" \
		LISTEN "$listen" \
		PORT "$port" \
		PLAN_ARGS "$plan_args" \
		SERVE_ARGS "$serve_args")
	install_text "$CONFIG_PATH" 0644 <<<"$text"
}

install_unit() {
	local profile_file=$1
	local text
	text=$(render "$SCRIPT_DIR/deploy/sparkrt.service.in" \
		CONFIG "$CONFIG_PATH" \
		PROFILE_NAME "${profile_file%.toml}" \
		BINARY "$prefix/bin/sparkrt" \
		MODEL_DIR "$model_dir")
	install_text "$UNIT_PATH" 0644 <<<"$text"
}

create_user() {
	# A staging tree has no user database to look in: say what would be done.
	if ! staging && getent passwd "$SERVICE_USER" >/dev/null; then
		say "unchanged user $SERVICE_USER"
		return 0
	fi
	host_run useradd --system --user-group --no-create-home --home-dir /nonexistent \
		--shell /usr/sbin/nologin "$SERVICE_USER"
	if ! staging; then
		changes=$((changes + 1))
		((dry_run)) || added+=("user $SERVICE_USER")
	fi
}

# On the host: warn when the service user could not read the kubelet config
# (a 0700 /var/lib/kubelet), since the preflight would then fail.
check_kubelet_readable() {
	if staging || ((dry_run)) || [[ ! -f $KUBELET_CONFIG ]]; then
		return 0
	fi
	if command -v runuser >/dev/null 2>&1 && ! runuser -u "$SERVICE_USER" -- test -r "$KUBELET_CONFIG"; then
		warn "user $SERVICE_USER cannot read $KUBELET_CONFIG: the service's preflight will fail until it can (e.g. chmod o+x on its folders and o+r on the file)"
	fi
}

# Enables the service. In a staging tree, enabling is the symlink
# `systemctl enable` would make; the host's systemd is not asked.
enable_service() {
	local unit_changed=$1
	if staging; then
		local link
		link=$(target "$WANTS_LINK")
		added+=("link $WANTS_LINK")
		if [[ -L $link && $(readlink "$link") == "$UNIT_PATH" ]]; then
			say "unchanged $WANTS_LINK (enabled)"
		else
			ensure_dir "$(dirname "$WANTS_LINK")"
			changes=$((changes + 1))
			if ((dry_run)); then
				say "would enable: link $WANTS_LINK -> $UNIT_PATH"
			else
				ln -sfn "$UNIT_PATH" "$link"
				say "enabled: linked $WANTS_LINK -> $UNIT_PATH"
			fi
		fi
	fi
	if ((unit_changed)); then
		host_run systemctl daemon-reload
	fi
	if staging || ((dry_run)) || ! systemctl is-enabled --quiet "$UNIT_NAME" 2>/dev/null; then
		host_run systemctl enable "$UNIT_NAME"
	else
		say "unchanged $UNIT_NAME (enabled)"
	fi
}

# Starts the service, or restarts it when this run changed something.
start_service() {
	if staging || ((dry_run)); then
		((no_start)) || host_run systemctl start "$UNIT_NAME"
		return 0
	fi
	local running=0
	systemctl is-active --quiet "$UNIT_NAME" && running=1
	if ((no_start)); then
		if ((running && changes > 0)); then
			say "note: $UNIT_NAME keeps running the old setup until it is restarted"
		fi
		return 0
	fi
	if ((running && changes == 0)); then
		say "unchanged $UNIT_NAME (running)"
		return 0
	fi
	local action=start
	((running)) && action=restart
	host_run systemctl "$action" "$UNIT_NAME" ||
		die "$UNIT_NAME did not $action (its preflight plan may not fit now): see journalctl -u $UNIT_NAME"
}

# The manifest: what earlier runs added plus what this run added, sorted, so
# that a second run writes the same bytes.
write_manifest() {
	added+=("file $MANIFEST_PATH")
	local previous="" entries
	if [[ -f $(target "$MANIFEST_PATH") ]]; then
		previous=$(grep -vE '^(#|$)' "$(target "$MANIFEST_PATH")" || true)
	fi
	entries=$(printf '%s\n' "$previous" "${added[@]}" | grep -v '^$' | LC_ALL=C sort -u)
	install_text "$MANIFEST_PATH" 0644 <<<"# Written by sparkrt's install.sh: what it added, for --uninstall.
$entries"
}

do_install() {
	if ! staging && ! ((dry_run)) && ((EUID != 0)); then
		die "installing on this host needs root (or use --root DIR / --dry-run)"
	fi
	check_machine
	obtain_binary
	local profile_src profile_file
	profile_src=$(profile_source)
	profile_file=$(basename "$profile_src")
	say "profile: $profile_src"
	preflight "$profile_src"
	report_kubelet

	install_file "$binary" "$prefix/bin/sparkrt" 0755
	install_file "$monitor" "$prefix/bin/$MONITOR_NAME" 0755
	install_profiles "$profile_src"
	install_config "$profile_file"
	local before=$changes
	install_unit "$profile_file"
	local unit_changed=$((changes > before))
	create_user
	check_kubelet_readable
	enable_service "$unit_changed"
	# Recorded before starting, so that --uninstall knows every file even
	# when the service then fails to start.
	write_manifest
	start_service
	if ((dry_run)); then
		say "dry run: $changes change(s) to make; nothing was changed"
	else
		say "done: $changes change(s)"
	fi
}

# -------------------------------------------------------------- uninstall

remove_path() {
	local kind=$1 path=$2 real
	real=$(target "$path")
	if ((dry_run)); then
		say "would remove $path"
		return 0
	fi
	case $kind in
	file | link) rm -f "$real" ;;
	dir)
		if ! rmdir "$real" 2>/dev/null; then
			warn "kept $path: not empty"
			return 0
		fi
		;;
	esac
	say "removed $path"
}

do_uninstall() {
	if ! staging && ! ((dry_run)) && ((EUID != 0)); then
		die "uninstalling from this host needs root (or use --root DIR / --dry-run)"
	fi
	local manifest
	manifest=$(target "$MANIFEST_PATH")
	if [[ ! -f $manifest ]]; then
		say "nothing to uninstall: no $MANIFEST_PATH"
		return 0
	fi
	if ! staging; then
		host_run systemctl disable --now "$UNIT_NAME" || warn "systemctl could not disable $UNIT_NAME"
	else
		host_run systemctl disable --now "$UNIT_NAME"
	fi
	local -a files=() dirs=() users=()
	local kind path
	while read -r kind path; do
		[[ -z $kind || $kind == \#* ]] && continue
		# Only plain absolute paths: a damaged manifest must not remove more.
		if [[ $kind != user && ($path != /* || $path == *..* || $path == /) ]]; then
			warn "skipping manifest entry '$kind $path'"
			continue
		fi
		case $kind in
		file | link) files+=("$kind $path") ;;
		dir) dirs+=("$path") ;;
		user) users+=("$path") ;;
		*) warn "skipping manifest entry '$kind $path'" ;;
		esac
	done <"$manifest"
	local entry
	for entry in "${files[@]}"; do
		remove_path "${entry%% *}" "${entry#* }"
	done
	# The compile cache the service made under its CacheDirectory=.
	if [[ -d $(target "$CACHE_PATH") ]]; then
		if ((dry_run)); then say "would remove $CACHE_PATH/"; else
			rm -rf -- "$(target "$CACHE_PATH")"
			say "removed $CACHE_PATH/"
		fi
	fi
	# Deepest folders first, so parents are empty when their turn comes.
	if ((${#dirs[@]})); then
		while read -r path; do
			remove_path dir "$path"
		done < <(printf '%s\n' "${dirs[@]}" | LC_ALL=C sort -r)
	fi
	for entry in "${users[@]}"; do
		host_run userdel "$entry"
	done
	staging || host_run systemctl daemon-reload
	if ((dry_run)); then say "dry run: nothing was changed"; else say "uninstalled"; fi
}

main() {
	parse_args "$@"
	validate_args
	if ((uninstall)); then
		do_uninstall
	else
		do_install
	fi
}

main "$@"
