from .lookup import get_path
