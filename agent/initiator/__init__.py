"""GPU-host role: discover, connect, find, attach, probe and detach pools."""
