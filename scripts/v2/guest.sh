#!/bin/bash
# Stage 2 in the cgroup v2 guest (PID 1): set up the host shape named by
# corral.scenario= on the kernel command line, run the tests there, print
#   V2RESULT <scenario> rc=<pytest rc> secs=<n> :: <pytest's last line>
# and power off. Scenarios:
#   a  root in the root cgroup
#   b  root in a leaf that holds processes (a systemd service: system.slice/x.service)
#   c  uid 1000 in a delegated cgroup (systemd Delegate=yes: the dir and its
#      cgroup.procs/subtree_control/threads chowned to the user), the shell inside it
#   d  root in a private cgroup namespace with cgroup2 remounted (docker --cgroupns=private)
#   e  uid 1000 in a login-session leaf with nothing delegated (root owns it), and
#      CORRAL_REQUIRE_STRICT unset: what cannot run must skip with its reason, not fail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
echo 1 > /proc/sys/kernel/sysrq
ip link set lo up
modprobe nfnetlink 2>/dev/null
echo "V2READY $(uname -r) controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
CG=/sys/fs/cgroup
echo "+memory +cpu +pids +io +cpuset" > $CG/cgroup.subtree_control

scenario=$(sed -n 's/.*corral\.scenario=\([a-z]*\).*/\1/p' /proc/cmdline)
mapfile -t extra < /job/pytest-args  # one argument a line
export PYTHONPATH=/job/v2 PYTHONDONTWRITEBYTECODE=1 CORRAL_REQUIRE_STRICT=1 HOME=/tmp/home
mkdir -p /tmp/home /tmp/junit && chmod 777 /tmp/home /tmp/junit
cd /job/src
# What shapes b and d (root, like a) leave out: tests whose outcome does not depend on
# where root's cgroup is, only on the uid, so a runs them for every root shape (about 3 of
# a shape's 6 minutes). test_quotas: the user-namespace quotas, /dev, pid 1's cmdline and
# binds of a sandbox, and the uid pool (per uid, not per cgroup). The doors and the core
# run as uid 65534 dropped from root: that uid owns no cgroup in a, b or d alike (the
# root-owned root, a root-owned service leaf, a root-owned namespace), so each takes the
# same no-delegated-cgroup branch; c and e run the doors as their own user (delegated, or
# not). What root itself sees in each shape (doctor's hierarchy, the caller's transcript,
# the provider, cgroups, outcomes, orphans) still runs in all five.
ROOT_SHAPE_REPEATS="tests/linux/test_quotas.py
tests/linux/test_nonroot_doors.py::test_corral_python_runs_at_the_strongest_and_doctor_says_the_same
tests/linux/test_nonroot_doors.py::test_cgroup_limits_asked_for_are_refused_where_the_user_has_none
tests/linux/test_nonroot_doors.py::test_run_snippet_holds_memory_for_a_user
tests/linux/test_nonroot_doors.py::test_mcp_run_in_sandbox_for_a_user
tests/linux/test_provider.py::test_core_as_unprivileged_uid"
export V2_LEAVE_OUT=""
case "$scenario" in b|d) V2_LEAVE_OUT=$ROOT_SHAPE_REPEATS ;; esac
run_tests() {
  local out=() n
  for n in $V2_LEAVE_OUT; do out+=(--deselect "$n"); done
  [ -z "$V2_LEAVE_OUT" ] || echo "left out here (run in scenario a):" $V2_LEAVE_OUT
  "${@}" /opt/venv/bin/python -m pytest -p no:cacheprovider -p v2_hypothesis -q -rs \
    --junitxml=/tmp/junit/out.xml "${extra[@]}" "${out[@]}" 2>&1 | tee /tmp/out
  local rc=${PIPESTATUS[0]}
  /opt/venv/bin/python /job/v2/times.py /tmp/junit/out.xml 2>/dev/null
  return "$rc"
}
enable() { echo "+memory +cpu +pids" > "$1/cgroup.subtree_control"; }
start=$(date +%s)
case "$scenario" in
  a) run_tests; rc=$? ;;
  b) mkdir -p $CG/system.slice/x.service && enable $CG/system.slice
     ( echo $BASHPID > $CG/system.slice/x.service/cgroup.procs
       echo "in $(cat /proc/self/cgroup)"; run_tests ); rc=$? ;;
  c) U=$CG/user.slice/user-1000.slice/user@1000.service
     mkdir -p $U && enable $CG/user.slice && enable $CG/user.slice/user-1000.slice
     chown 1000:1000 $U $U/cgroup.procs $U/cgroup.subtree_control $U/cgroup.threads
     chown 1000:1000 /tmp/home
     ( echo $BASHPID > $U/cgroup.procs
       echo "in $(cat /proc/self/cgroup) as uid 1000"
       run_tests setpriv --reuid 1000 --regid 1000 --clear-groups --inh-caps=-all ); rc=$? ;;
  d) mkdir -p $CG/docker/ctr && enable $CG/docker
     ( echo $BASHPID > $CG/docker/ctr/cgroup.procs
       export -f run_tests
       unshare -Cm --propagation private bash -c '
         umount /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup
         mapfile -t extra < /job/pytest-args
         echo "in $(cat /proc/self/cgroup) (private cgroup namespace)"; run_tests' ); rc=$? ;;
  e) S=$CG/user.slice/user-1000.slice/session-1.scope
     mkdir -p $S && enable $CG/user.slice && enable $CG/user.slice/user-1000.slice
     chown 1000:1000 /tmp/home
     ( echo $BASHPID > $S/cgroup.procs
       echo "in $(cat /proc/self/cgroup) as uid 1000, nothing delegated"
       CORRAL_REQUIRE_STRICT=0 run_tests setpriv --reuid 1000 --regid 1000 --clear-groups \
         --inh-caps=-all ); rc=$? ;;
  *) echo "unknown scenario '$scenario'"; rc=99 ;;
esac
secs=$(( $(date +%s) - start ))
# the evidence: where corral put itself and its sandboxes' parents
echo "V2CGROUPS $(cd $CG && find . -mindepth 1 -maxdepth 5 -type d -name 'corral*' | sort | tr '\n' ' ')"
echo "V2RESULT $scenario rc=$rc secs=$secs :: $(grep -E '(passed|failed|error|skipped|no tests ran)' /tmp/out 2>/dev/null | tail -1)"
sync
echo o > /proc/sysrq-trigger
sleep 10
