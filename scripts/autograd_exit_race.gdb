# The abort at interpreter exit ("terminate called without an active exception", SIGABRT), made to happen.
# hook.py, Note [Autograd threads at interpreter exit], says why; this holds the autograd thread where it waits.
#
#   LD_PRELOAD=... (the fake GPU's runtime and cuBLAS, docs/fakegpu.md) gdb -batch -nx -x scripts/autograd_exit_race.gdb \
#       --args .venv-cuda/bin/python -c "import torch; x = torch.ones(1 << 20, device='cuda', requires_grad=True); \
#       (x * 2).relu().sum().backward()"
#
# After a CUDA backward has completed, the autograd thread sometimes holds the last reference to the backward's
# GraphTask; releasing it frees the contextvars.Context copy that torch.autograd.graph._engine_run_backward stashed,
# which takes the GIL. This script stops that thread as it asks for the GIL and lets only the main thread run, until
# the interpreter finalizes; then every thread runs again, and the autograd thread, inside take_gil, is ended with
# pthread_exit, whose unwinding through ~GraphTask calls std::terminate. When the main thread was the GraphTask's
# last owner, nothing is held and the run exits normally (5 runs of 7 on torch 2.14.1+cu130, Python 3.11.7).
set pagination off
set breakpoint pending on
set $armed = 0
set $held = 0
break torch::autograd::GraphTask::mark_as_completed_and_run_post_processing
commands
silent
set $armed = 1
continue
end
break PyEval_AcquireThread if $_thread != 1 && $armed == 1 && $held == 0
commands
silent
set $held = $_thread
printf "autograd thread %d asks for the GIL after the backward completed: held while the main thread runs\n", $_thread
bt 8
thread 1
set scheduler-locking on
continue
end
break finalize_modules
commands
silent
printf "the interpreter finalizes (held thread %d): every thread runs again\n", $held
set scheduler-locking off
continue
end
break THPEngine_run_backward if $held != 0
commands
silent
printf "the main thread runs a backward (held thread %d): every thread runs again\n", $held
set scheduler-locking off
continue
end
run
bt 30
