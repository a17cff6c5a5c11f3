import calendar
from datetime import date, datetime, timedelta, timezone

today = date(2024, 2, 28)
print(today + timedelta(days=2), calendar.isleap(2024))
print(datetime(2024, 1, 1, tzinfo=timezone.utc).isoformat())
