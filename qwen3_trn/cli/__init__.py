"""The light front of every command: bad input answered before torch is imported; exit statuses."""
