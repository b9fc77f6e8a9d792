"""The storage-host role: backings, pools and their nvmet export."""
