import logging

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
log = logging.getLogger("demo")
log.info("hello %s", "world")
log.warning("careful")
